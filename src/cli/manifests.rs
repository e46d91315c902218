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
pub mod controllers;
pub mod convert;
pub mod derived;
pub mod driver_config;
pub mod extended;
pub mod kueue;
pub mod placement;
pub mod pod_group;
pub mod taint_rules;
pub mod validate;
pub mod validate_slice;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use convert::{FieldError, Kind, V1Object, Version};

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

/// Hands each document of `source` (a file, a directory: its `*.yaml`, `*.yml`, `*.json`, by
/// name, as `kubectl apply -f DIR`, or `-` for stdin) to `take`, one file at a time, so a
/// directory of many large files is never held whole.
pub fn for_each_document(
    source: &str,
    mut take: impl FnMut(Doc) -> Result<(), ManifestError>,
) -> Result<(), ManifestError> {
    for_each_text(source, |text, file| {
        for pending in parse_pending(text, file)? {
            take(pending.parse()?)?;
        }
        Ok(())
    })
}

/// Hands the text of each file of `source`, as [`for_each_document`] reads them, to `take`.
fn for_each_text(
    source: &str,
    mut take: impl FnMut(&str, &str) -> Result<(), ManifestError>,
) -> Result<(), ManifestError> {
    let read_error = |file: &Path, e: std::io::Error| ManifestError::Read {
        file: file.display().to_string(),
        message: e.to_string(),
    };
    if source == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| read_error(Path::new("-"), e))?;
        return take(&text, "-");
    }
    let path = PathBuf::from(source);
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in std::fs::read_dir(&path).map_err(|e| read_error(&path, e))? {
            let p = entry.map_err(|e| read_error(&path, e))?.path();
            let wanted = p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            if wanted && p.is_file() {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path);
    }
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| read_error(&file, e))?;
        take(&text, &file.display().to_string())?;
    }
    Ok(())
}

pub fn parse_text(text: &str, file: &str) -> Result<Vec<Doc>, ManifestError> {
    parse_pending(text, file)?
        .into_iter()
        .map(PendingDoc::parse)
        .collect()
}

/// A document read but not yet parsed. A JSON List's items stay text until taken: a fleet's
/// slices are never all parsed trees at once (that took gigabytes at 1,000 nodes), and
/// several threads can parse them.
struct PendingDoc<'t> {
    body: Pending<'t>,
    origin: Origin,
}

enum Pending<'t> {
    Parsed(Value),
    Text(&'t RawValue),
}

impl PendingDoc<'_> {
    fn parse(self) -> Result<Doc, ManifestError> {
        let value = match self.body {
            Pending::Parsed(value) => value,
            // Already read once as JSON: only the depth limit could stop it here.
            Pending::Text(raw) => {
                serde_json::from_str(raw.get()).map_err(|e| ManifestError::Document {
                    origin: self.origin.clone(),
                    message: e.to_string(),
                })?
            }
        };
        Ok(Doc {
            value,
            origin: self.origin,
        })
    }
}

/// A v1 ResourceSlice straight from its JSON text, or `None` where the general path (a `Value`,
/// then [`convert::to_v1`]) must read it: that path fills in what Go reads as zero values (a
/// null list item, an omitted counter value) and names an unknown field, and each of those
/// fails to decode here (k8s-openapi also refuses another kind or apiVersion). What decodes
/// here with no field left unread is what that path decodes.
fn slice_from_text(raw: &RawValue) -> Option<ResourceSlice> {
    let mut unknown = false;
    let mut decoder = serde_json::Deserializer::from_str(raw.get());
    let slice: ResourceSlice = serde_ignored::deserialize(&mut decoder, |_| unknown = true).ok()?;
    // k8s-openapi reads an omitted or null `value` as "", where the general path fills in 0.
    let spec = &slice.spec;
    let counters = spec
        .shared_counters
        .iter()
        .flatten()
        .flat_map(|set| set.counters.values())
        .chain(
            spec.devices
                .iter()
                .flatten()
                .flat_map(|d| d.consumes_counters.iter().flatten())
                .flat_map(|c| c.counters.values()),
        )
        .map(|counter| &counter.value);
    let capacities = spec
        .devices
        .iter()
        .flatten()
        .flat_map(|d| d.capacity.iter().flatten())
        .map(|(_, capacity)| &capacity.value);
    let omitted = counters.chain(capacities).any(|q| q.0.is_empty());
    (!unknown && !omitted).then_some(slice)
}

/// A top-level document of a file: a JSON List's items, other JSON as text, YAML parsed.
enum Top<'t> {
    List(Vec<&'t RawValue>),
    Text(&'t RawValue),
    Parsed(Value),
}

/// What says whether a JSON document is a List, its items left as text.
#[derive(serde::Deserialize)]
struct ListPeek<'t> {
    #[serde(borrow, default)]
    kind: Option<std::borrow::Cow<'t, str>>,
    #[serde(borrow, default)]
    items: Option<Vec<&'t RawValue>>,
}

/// The items of a JSON List (`kind` ending in `List`, `items` a list), as text; `None` for any
/// other document, which is then parsed whole (and a malformed List refused as before).
fn list_items_of(text: &str) -> Option<Vec<&RawValue>> {
    match serde_json::from_str::<ListPeek<'_>>(text) {
        Ok(ListPeek {
            kind: Some(kind),
            items: Some(items),
        }) if kind.ends_with("List") => Some(items),
        _ => None,
    }
}

fn parse_pending<'t>(text: &'t str, file: &str) -> Result<Vec<PendingDoc<'t>>, ManifestError> {
    let file: Arc<str> = Arc::from(file);
    let parse_error = |document: usize, e: &dyn fmt::Display| ManifestError::Read {
        file: file.to_string(),
        message: format!("document {document}: {e}"),
    };
    let mut tops = Vec::new();
    let trimmed = text.trim_start();
    let whole_list = trimmed
        .starts_with('{')
        .then(|| list_items_of(text))
        .flatten();
    if let Some(items) = whole_list {
        // One List, as `kubectl get -o json` writes a fleet's slices: its items found in one
        // pass over the text.
        tops.push(Top::List(items));
    } else if trimmed.starts_with('{') || trimmed.starts_with('[') {
        for (i, raw) in serde_json::Deserializer::from_str(text)
            .into_iter::<&RawValue>()
            .enumerate()
        {
            tops.push(Top::Text(raw.map_err(|e| parse_error(i + 1, &e))?));
        }
    } else {
        for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let value: Value =
                serde::Deserialize::deserialize(document).map_err(|e| parse_error(i + 1, &e))?;
            tops.push(Top::Parsed(value));
        }
    }
    let mut docs = Vec::new();
    for (i, top) in tops.into_iter().enumerate() {
        let origin = Origin {
            file: file.clone(),
            document: i + 1,
            item: None,
        };
        // A JSON List's items are kept as text, unparsed.
        let push_items = |docs: &mut Vec<PendingDoc<'t>>, items: Vec<&'t RawValue>| {
            for (n, item) in items.into_iter().enumerate() {
                if item.get().trim() == "null" {
                    continue;
                }
                docs.push(PendingDoc {
                    body: Pending::Text(item),
                    origin: Origin {
                        item: Some(n + 1),
                        ..origin.clone()
                    },
                });
            }
        };
        let value = match top {
            Top::List(items) => {
                push_items(&mut docs, items);
                continue;
            }
            Top::Text(raw) => {
                if let Some(items) = list_items_of(raw.get()) {
                    push_items(&mut docs, items);
                    continue;
                }
                serde_json::from_str(raw.get()).map_err(|e| parse_error(i + 1, &e))?
            }
            Top::Parsed(value) => value,
        };
        let items = match value {
            Value::Null => continue,
            Value::Array(items) => items,
            Value::Object(mut map) if is_list(&map) => match map.remove("items") {
                Some(Value::Array(items)) => items,
                Some(Value::Null) | None => Vec::new(),
                Some(_) => {
                    return Err(ManifestError::Document {
                        origin,
                        message: "items: must be a list".into(),
                    });
                }
            },
            other => {
                docs.push(PendingDoc {
                    body: Pending::Parsed(other),
                    origin,
                });
                continue;
            }
        };
        for (n, item) in items.into_iter().enumerate() {
            if item.is_null() {
                continue;
            }
            docs.push(PendingDoc {
                body: Pending::Parsed(item),
                origin: Origin {
                    item: Some(n + 1),
                    ..origin.clone()
                },
            });
        }
    }
    Ok(docs)
}

fn is_list(map: &Map<String, Value>) -> bool {
    map.contains_key("items")
        && map
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"))
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

/// A kind with a pod spec: its API group/version and where the pod spec is.
struct PodKind {
    kind: &'static str,
    group_version: &'static str,
    spec_path: Vec<String>,
    spec_field: String,
}

fn pod_kind(kind: &str) -> Option<PodKind> {
    const POD: &[&str] = &["spec"];
    const TEMPLATE: &[&str] = &["spec", "template", "spec"];
    const CRON: &[&str] = &["spec", "jobTemplate", "spec", "template", "spec"];
    let (kind, group_version, spec_path) = match kind {
        "Pod" => ("Pod", "v1", POD),
        "Deployment" => ("Deployment", "apps/v1", TEMPLATE),
        "ReplicaSet" => ("ReplicaSet", "apps/v1", TEMPLATE),
        "StatefulSet" => ("StatefulSet", "apps/v1", TEMPLATE),
        "DaemonSet" => ("DaemonSet", "apps/v1", TEMPLATE),
        "Job" => ("Job", "batch/v1", TEMPLATE),
        "CronJob" => ("CronJob", "batch/v1", CRON),
        // KubeVirt: the VMI's spec holds `resourceClaims` as a pod spec does.
        "VirtualMachineInstance" => ("VirtualMachineInstance", "kubevirt.io/v1", POD),
        "VirtualMachine" => ("VirtualMachine", "kubevirt.io/v1", TEMPLATE),
        _ => return None,
    };
    Some(PodKind {
        kind,
        group_version,
        spec_path: spec_path.iter().map(|s| s.to_string()).collect(),
        spec_field: spec_path.join("."),
    })
}

impl Manifests {
    /// Reads `-f` sources: any mix of the kinds this module knows; others are noted and
    /// skipped. `default_kind` is assumed for documents without `kind` (the positional
    /// `CLAIM.yaml`, which never needed one).
    pub fn add_sources(
        &mut self,
        sources: &[String],
        default_kind: Option<Kind>,
    ) -> Result<(), ManifestError> {
        for source in sources {
            for_each_document(source, |doc| self.add_document(doc, default_kind, None))?;
        }
        Ok(())
    }

    /// Reads files that must hold `kind` only (`--classes`, `--slices`, `--allocated`).
    pub fn add_typed(&mut self, paths: &[PathBuf], kind: Kind) -> Result<(), ManifestError> {
        for path in paths {
            for_each_text(&path.display().to_string(), |text, file| {
                let docs = parse_pending(text, file)?;
                if kind == Kind::ResourceSlice {
                    return self.add_slices(docs);
                }
                for doc in docs {
                    self.add_document(doc.parse()?, Some(kind), Some(kind))?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// ResourceSlices, read on several threads when there are many (a fleet's): each thread
    /// reads its share in order into a `Manifests` of its own, and the shares are appended in
    /// order, so what is read, and the first error in input order, are what one reader finds.
    fn add_slices(&mut self, docs: Vec<PendingDoc<'_>>) -> Result<(), ManifestError> {
        /// A thread starts in tens of microseconds; a slice decodes in about as long.
        const PER_THREAD: usize = 32;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(docs.len() / PER_THREAD)
            .max(1);
        let read = |part: &mut Manifests, docs: Vec<PendingDoc<'_>>| {
            docs.into_iter().try_for_each(|doc| part.add_slice(doc))
        };
        if threads == 1 {
            return read(self, docs);
        }
        let share = docs.len().div_ceil(threads);
        let mut rest = docs.into_iter();
        let shares: Vec<Vec<PendingDoc<'_>>> = (0..threads)
            .map(|_| rest.by_ref().take(share).collect())
            .collect();
        let gates = self.gates;
        let parts: Vec<Result<Manifests, ManifestError>> = std::thread::scope(|scope| {
            let running: Vec<_> = shares
                .into_iter()
                .map(|docs| {
                    scope.spawn(move || {
                        let mut part = Manifests::with_gates(gates);
                        read(&mut part, docs).map(|()| part)
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|thread| {
                    thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        for part in parts {
            self.append(part?);
        }
        Ok(())
    }

    /// One ResourceSlice document: a v1 slice decoded straight from its text when that reads
    /// what the general path would read (a third of the time at 1,000 nodes), else the general
    /// path.
    fn add_slice(&mut self, doc: PendingDoc<'_>) -> Result<(), ManifestError> {
        let fast = match &doc.body {
            Pending::Text(raw) => slice_from_text(raw),
            Pending::Parsed(_) => None,
        };
        let Some(slice) = fast else {
            return self.add_document(
                doc.parse()?,
                Some(Kind::ResourceSlice),
                Some(Kind::ResourceSlice),
            );
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        let name = slice
            .metadata
            .name
            .as_deref()
            .or(slice.metadata.generate_name.as_deref())
            .unwrap_or("<no name>");
        let object = format!("ResourceSlice {name}");
        self.push_slice(slice, &object, doc.origin, seq)
    }

    /// `part`'s objects, as if read after this one's.
    fn append(&mut self, part: Manifests) {
        fn shift<T>(to: &mut Vec<Entry<T>>, from: Vec<Entry<T>>, base: usize) {
            to.extend(from.into_iter().map(|mut e| {
                e.seq += base;
                e
            }));
        }
        // Every field named: a new one must be thought about here.
        let Manifests {
            claims,
            templates,
            classes,
            slices,
            taint_rules,
            nodes,
            workloads,
            pod_groups,
            kueue,
            notes,
            gates: _,
            next_seq,
        } = part;
        // A slice-only read holds no Kueue object.
        debug_assert!(kueue.is_empty());
        let base = self.next_seq;
        shift(&mut self.claims, claims, base);
        shift(&mut self.templates, templates, base);
        shift(&mut self.classes, classes, base);
        shift(&mut self.slices, slices, base);
        shift(&mut self.taint_rules, taint_rules, base);
        shift(&mut self.nodes, nodes, base);
        // Workloads carry their seq inside too; a slice-only read makes none.
        debug_assert!(workloads.is_empty());
        shift(&mut self.workloads, workloads, base);
        shift(&mut self.pod_groups, pod_groups, base);
        self.notes.extend(notes);
        self.next_seq += next_seq;
    }

    /// Documents read elsewhere (a live cluster's objects), as `-f` takes them.
    pub fn add_documents(&mut self, docs: Vec<Doc>) -> Result<(), ManifestError> {
        for doc in docs {
            self.add_document(doc, None, None)?;
        }
        Ok(())
    }

    fn add_document(
        &mut self,
        doc: Doc,
        default_kind: Option<Kind>,
        only: Option<Kind>,
    ) -> Result<(), ManifestError> {
        let Doc { mut value, origin } = doc;
        let document_error = |message: String| ManifestError::Document {
            origin: origin.clone(),
            message,
        };
        let Value::Object(map) = &mut value else {
            return Err(document_error("not an object".into()));
        };
        // Files of one kind never needed `kind` or `apiVersion`: v1 of that kind is assumed.
        if let Some(kind) = default_kind {
            let named = map.get("kind").and_then(Value::as_str);
            if named.is_none_or(|k| k == kind.name()) {
                map.insert("kind".into(), Value::from(kind.name()));
                map.entry("apiVersion")
                    .or_insert_with(|| Value::from(Version::V1.api_version()));
            }
        }
        let kind = map
            .get("kind")
            .and_then(Value::as_str)
            .ok_or_else(|| document_error("kind is not set".into()))?
            .to_string();
        let api_version = map
            .get("apiVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| document_error(format!("{kind}: apiVersion is not set")))?
            .to_string();
        let seq = self.next_seq;
        self.next_seq += 1;
        // Rules come with the objects they taint: in -f inputs and beside --allocated claims
        // (a dump of the cluster's state).
        if kind == "DeviceTaintRule" && only.is_none_or(|k| k == Kind::ResourceClaim) {
            let object = format!("DeviceTaintRule {}", raw_identity(&value, false));
            let mut rule = taint_rules::to_v1(&api_version, &value)
                .map_err(|e| field_error(&object, &origin, e))?;
            name_object(&mut rule.metadata, false, &origin)
                .map_err(|e| field_error(&object, &origin, e))?;
            self.taint_rules.push(Entry {
                object: rule,
                origin,
                seq,
            });
            return Ok(());
        }
        // Nodes, like rules, come with the pods (a fleet to place them on) or the cluster's state.
        if kind == "Node" && only.is_none_or(|k| k == Kind::ResourceClaim) {
            let object = format!("Node {}", raw_identity(&value, false));
            if api_version != "v1" {
                return Err(field_error(
                    &object,
                    &origin,
                    FieldError::new(
                        "apiVersion",
                        format!("{api_version:?} does not serve Node; use v1"),
                    ),
                ));
            }
            let mut node: k8s_openapi::api::core::v1::Node = serde_json::from_value(value)
                .map_err(|e| field_error(&object, &origin, FieldError::new("", e.to_string())))?;
            name_object(&mut node.metadata, false, &origin)
                .map_err(|e| field_error(&object, &origin, e))?;
            self.nodes.push(Entry {
                object: node,
                origin,
                seq,
            });
            return Ok(());
        }
        if let Some(expected) = only
            && kind != expected.name()
        {
            return Err(document_error(format!(
                "expected a {}, found a {kind}",
                expected.name()
            )));
        }
        if let Some(k) = Kind::parse(&kind) {
            let object = format!("{kind} {}", raw_identity(&value, k.namespaced()));
            let version = Version::parse(&api_version).ok_or_else(|| {
                field_error(
                    &object,
                    &origin,
                    FieldError::new(
                        "apiVersion",
                        format!(
                            "{api_version:?} does not serve {kind}; use resource.k8s.io/v1 (or v1beta2, v1beta1)"
                        ),
                    ),
                )
            })?;
            return self.add_resource(k, version, &value, &object, origin, seq, only.is_none());
        }
        if kind == crate::compute_domain::api::KIND && only.is_none() {
            // NVIDIA's controller makes the domain's channel template: match gets it the same.
            let object = format!("{kind} {}", raw_identity(&value, true));
            let template = crate::compute_domain::api::template_of_manifest(&api_version, &value)
                .map_err(|e| field_error(&object, &origin, FieldError::new(e.0, e.1)))?;
            self.notes.push(format!(
                "{object} ({origin}): its channel ResourceClaimTemplate, as the ComputeDomain controller makes it"
            ));
            return self.add_document(
                Doc {
                    value: template,
                    origin,
                },
                None,
                None,
            );
        }
        if controllers::handles(&kind, &api_version) && only.is_none() {
            return self.add_controlled(&kind, &api_version, &value, origin, seq);
        }
        if let Some(pk) = pod_kind(&kind) {
            let object = format!("{kind} {}", raw_identity(&value, true));
            if api_version != pk.group_version {
                return Err(field_error(
                    &object,
                    &origin,
                    FieldError::new(
                        "apiVersion",
                        format!(
                            "{api_version:?} does not serve {kind}; use {}",
                            pk.group_version
                        ),
                    ),
                ));
            }
            let mut workload = parse_workload(&pk, &value, &origin, seq)
                .map_err(|e| field_error(&object, &origin, e))?;
            if kind == "Job" {
                self.job_suspension(&mut workload, &value, &object, &origin)?;
            }
            self.workloads.push(Entry {
                object: workload,
                origin,
                seq,
            });
            return Ok(());
        }
        if kueue::handles(&kind, &api_version) && only.is_none() {
            let object = format!("{kind} {}", raw_identity(&value, kind == "LocalQueue"));
            self.kueue
                .add(&kind, &value)
                .map_err(|e| field_error(&object, &origin, e))?;
            return Ok(());
        }
        if kind == "PodGroup" && api_version.starts_with("scheduling.k8s.io/") && only.is_none() {
            let object = format!("{kind} {}", raw_identity(&value, true));
            let group = pod_group::PodGroup::parse(&api_version, &value)
                .map_err(|e| field_error(&object, &origin, e))?;
            self.pod_groups.push(Entry {
                object: group,
                origin,
                seq,
            });
            return Ok(());
        }
        self.notes.push(format!(
            "skipped {kind} {} ({origin}): not a Pod, workload or DRA object",
            raw_identity(&value, false)
        ));
        Ok(())
    }

    /// A workload controller's object: one workload per pod template, named `<object>-<role>`,
    /// with the pods the controller names, grouped as the one object they belong to.
    fn add_controlled(
        &mut self,
        kind: &str,
        api_version: &str,
        value: &Value,
        origin: Origin,
        seq: usize,
    ) -> Result<(), ManifestError> {
        let object = format!("{kind} {}", raw_identity(value, true));
        let fail = |e: FieldError| field_error(&object, &origin, e);
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| fail(FieldError::new("metadata.name", "Required value")))?;
        let expansion =
            controllers::expand(kind, api_version, value, name, &|seed| name_chars(seed, 5))
                .map_err(fail)?;
        for note in &expansion.notes {
            self.notes.push(format!("{object} ({origin}): {note}"));
        }
        let total = expansion.roles.iter().map(|r| r.pods.len() as u64).sum();
        let whole = format!(
            "{} {}/{name}",
            expansion.kind,
            value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or(DEFAULT_NAMESPACE)
        );
        for role in expansion.roles {
            let pk = PodKind {
                kind: expansion.kind,
                group_version: "",
                spec_path: role.spec_path,
                spec_field: role.spec_field,
            };
            let mut workload = parse_workload(&pk, value, &origin, seq).map_err(fail)?;
            workload.name = format!("{}-{}", workload.name, role.name);
            workload.replicas = Replicas::Replicas(role.pods.len() as u64);
            workload.pod_names = Some(role.pods);
            workload.group = Some(Group {
                object: whole.clone(),
                pods: total,
                gang: expansion.gang.clone(),
            });
            self.workloads.push(Entry {
                object: workload,
                origin: origin.clone(),
                seq,
            });
        }
        Ok(())
    }

    /// A suspended batch/v1 Job runs no pods, unless Kueue queues it: then it is read as
    /// admitted.
    fn job_suspension(
        &mut self,
        workload: &mut Workload,
        value: &Value,
        object: &str,
        origin: &Origin,
    ) -> Result<(), ManifestError> {
        match value.pointer("/spec/suspend") {
            None | Some(Value::Null | Value::Bool(false)) => {}
            Some(Value::Bool(true)) => match controllers::queue_name(value) {
                Some(queue) => self.notes.push(format!(
                    "{object} ({origin}): spec.suspend is true and Kueue queues it (LocalQueue {queue:?}): read as admitted"
                )),
                None => {
                    self.notes.push(format!(
                        "{object} ({origin}): spec.suspend is true and no Kueue queue ({}) admits it: the Job controller makes no pods",
                        controllers::KUEUE_QUEUE_LABEL
                    ));
                    workload.replicas = Replicas::Parallel(0);
                }
            },
            Some(other) => {
                return Err(field_error(
                    object,
                    origin,
                    FieldError::new(
                        "spec.suspend",
                        format!("Invalid value: {other}: must be a boolean"),
                    ),
                ));
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn add_resource(
        &mut self,
        kind: Kind,
        version: Version,
        value: &Value,
        object: &str,
        origin: Origin,
        seq: usize,
        validate_claims: bool,
    ) -> Result<(), ManifestError> {
        let fail = |e: FieldError| field_error(object, &origin, e);
        let converted = convert::to_v1(kind, version, value).map_err(fail)?;
        match converted {
            V1Object::Claim(claim) => {
                let mut claim = *claim;
                name_object(&mut claim.metadata, true, &origin).map_err(fail)?;
                if validate_claims {
                    validate::claim_spec(claim.spec.as_ref(), "spec", self.gates).map_err(fail)?;
                }
                self.claims.push(Entry {
                    object: claim,
                    origin,
                    seq,
                });
            }
            V1Object::Template(template) => {
                let mut template = *template;
                name_object(&mut template.metadata, true, &origin).map_err(fail)?;
                template_metadata(template.spec.as_ref().and_then(|s| s.metadata.as_ref()))
                    .map_err(fail)?;
                let spec = template.spec.as_ref().and_then(|s| s.spec.as_ref());
                validate::claim_spec(spec, "spec.spec", self.gates).map_err(fail)?;
                self.templates.push(Entry {
                    object: template,
                    origin,
                    seq,
                });
            }
            V1Object::Class(class) => {
                let mut class = *class;
                name_object(&mut class.metadata, false, &origin).map_err(fail)?;
                validate::class_spec(class.spec.as_ref(), self.gates).map_err(fail)?;
                self.classes.push(Entry {
                    object: class,
                    origin,
                    seq,
                });
            }
            V1Object::Slice(slice) => self.push_slice(*slice, object, origin, seq)?,
        }
        Ok(())
    }

    /// A decoded v1 slice: named and checked as the API server would, then kept.
    fn push_slice(
        &mut self,
        mut slice: ResourceSlice,
        object: &str,
        origin: Origin,
        seq: usize,
    ) -> Result<(), ManifestError> {
        let fail = |e: FieldError| field_error(object, &origin, e);
        name_object(&mut slice.metadata, false, &origin).map_err(fail)?;
        validate_slice::slice_spec(&slice.spec, self.gates).map_err(fail)?;
        self.slices.push(Entry {
            object: slice,
            origin,
            seq,
        });
        Ok(())
    }

    /// The resource.k8s.io objects read, as v1 JSON, in input order.
    pub fn v1_objects(&self) -> Result<Vec<(usize, Value)>, serde_json::Error> {
        let mut out = Vec::new();
        for e in &self.classes {
            out.push((e.seq, serde_json::to_value(&e.object)?));
        }
        for e in &self.templates {
            out.push((e.seq, serde_json::to_value(&e.object)?));
        }
        for e in &self.claims {
            out.push((e.seq, serde_json::to_value(&e.object)?));
        }
        for e in &self.slices {
            out.push((e.seq, serde_json::to_value(&e.object)?));
        }
        out.sort_by_key(|(seq, _)| *seq);
        Ok(out)
    }
}

/// Fills in the namespace (namespaced kinds) and a name from `generateName`; checks the name.
fn name_object(meta: &mut ObjectMeta, namespaced: bool, origin: &Origin) -> Result<(), FieldError> {
    if namespaced && meta.namespace.as_deref().unwrap_or("").is_empty() {
        meta.namespace = Some(DEFAULT_NAMESPACE.to_string());
    }
    if let Some(namespace) = meta.namespace.as_deref() {
        validate::dns_label(namespace, "metadata.namespace")?;
    }
    if meta.name.as_deref().unwrap_or("").is_empty() {
        match meta.generate_name.as_deref().filter(|g| !g.is_empty()) {
            Some(base) => meta.name = Some(generated_name(base, &origin.to_string())),
            None => return Err(FieldError::new("metadata.name", "Required value")),
        }
    }
    validate::dns_subdomain(meta.name.as_deref().unwrap_or(""), "metadata.name")?;
    validate::labels_and_annotations(meta.labels.as_ref(), meta.annotations.as_ref(), "metadata")
}

/// "ObjectMeta may contain labels and annotations ... No other fields are allowed".
fn template_metadata(meta: Option<&ObjectMeta>) -> Result<(), FieldError> {
    let Some(meta) = meta else { return Ok(()) };
    let allowed = ObjectMeta {
        labels: meta.labels.clone(),
        annotations: meta.annotations.clone(),
        ..Default::default()
    };
    if *meta != allowed {
        return Err(FieldError::new(
            "spec.metadata",
            "Forbidden: only labels and annotations may be set",
        ));
    }
    validate::labels_and_annotations(
        meta.labels.as_ref(),
        meta.annotations.as_ref(),
        "spec.metadata",
    )
}

fn at_path<'a, S: AsRef<str>>(value: &'a Value, path: &[S]) -> Option<&'a Value> {
    controllers::at(value, path)
}

/// A non-negative integer field (absent or null: `default`).
fn count_field(value: &Value, path: &[&str], default: u64) -> Result<u64, FieldError> {
    match at_path(value, path) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_u64().ok_or_else(|| {
            FieldError::new(
                path.join("."),
                format!("Invalid value: {v}: must be greater than or equal to 0"),
            )
        }),
    }
}

fn parse_workload(
    pk: &PodKind,
    value: &Value,
    origin: &Origin,
    seq: usize,
) -> Result<Workload, FieldError> {
    let meta = value.get("metadata").unwrap_or(&Value::Null);
    let text = |key: &str| meta.get(key).and_then(Value::as_str).unwrap_or("");
    let namespace = match text("namespace") {
        "" => DEFAULT_NAMESPACE.to_string(),
        ns => ns.to_string(),
    };
    let name = match (text("name"), text("generateName")) {
        ("", "") => return Err(FieldError::new("metadata.name", "Required value")),
        ("", base) => generated_name(base, &format!("{origin}#{seq}")),
        (name, _) => name.to_string(),
    };
    validate::dns_subdomain(&name, "metadata.name")?;
    let field = format!("{}.resourceClaims", pk.spec_field);
    let mut claims = Vec::new();
    let mut names = HashSet::new();
    let entries = match at_path(value, &pk.spec_path).and_then(|s| s.get("resourceClaims")) {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(entries)) => entries.as_slice(),
        Some(_) => return Err(FieldError::new(field, "must be a list")),
    };
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let Value::Object(map) = entry else {
            return Err(FieldError::new(at, "must be an object"));
        };
        for (key, v) in map {
            let known = matches!(
                key.as_str(),
                "name" | "resourceClaimName" | "resourceClaimTemplateName"
            );
            if !known && !v.is_null() {
                return Err(FieldError::new(convert::child(&at, key), "unknown field"));
            }
        }
        let get = |key: &str| -> Result<Option<String>, FieldError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(FieldError::new(
                    format!("{at}.{key}"),
                    format!("Invalid value: {other}: must be a string"),
                )),
            }
        };
        let name =
            get("name")?.ok_or_else(|| FieldError::new(format!("{at}.name"), "Required value"))?;
        if !names.insert(name.clone()) {
            return Err(FieldError::new(
                format!("{at}.name"),
                format!("Duplicate value: {name:?}"),
            ));
        }
        let source = match (get("resourceClaimName")?, get("resourceClaimTemplateName")?) {
            (Some(claim), None) => ClaimRef::Named(claim),
            (None, Some(template)) => ClaimRef::Template(template),
            (None, None) => {
                return Err(FieldError::new(
                    at,
                    "Required value: must specify one of: `resourceClaimName`, `resourceClaimTemplateName`",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    at,
                    "Invalid value: at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified",
                ));
            }
        };
        claims.push(PodClaim { name, source });
    }
    if pk.kind.starts_with("VirtualMachine") {
        device_claim_refs(value, pk, &names)?;
    }
    let job = |spec: &[&'static str]| -> Result<Replicas, FieldError> {
        let with = |key: &'static str| [spec, &[key]].concat();
        let parallelism = count_field(value, &with("parallelism"), 1)?;
        let completions = count_field(value, &with("completions"), u64::MAX)?;
        Ok(Replicas::Parallel(parallelism.min(completions)))
    };
    let replicas = match pk.kind {
        "Pod" | "VirtualMachineInstance" => Replicas::Replicas(1),
        "VirtualMachine" => Replicas::Replicas(u64::from(vm_runs(value)?)),
        "DaemonSet" => Replicas::PerNode,
        "Job" => job(&["spec"])?,
        "CronJob" => job(&["spec", "jobTemplate", "spec"])?,
        _ => Replicas::Replicas(count_field(value, &["spec", "replicas"], 1)?),
    };
    let spec = at_path(value, &pk.spec_path);
    let containers = extended::containers(spec, &pk.spec_field)?;
    let placement = placement::PodPlacement::from_spec(spec, &pk.spec_field)?;
    let pod_group = match spec.and_then(|s| s.pointer("/schedulingGroup/podGroupName")) {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if !name.is_empty() => Some(name.clone()),
        Some(other) => {
            return Err(FieldError::new(
                format!("{}.schedulingGroup.podGroupName", pk.spec_field),
                format!("Invalid value: {other}: must be a PodGroup's name"),
            ));
        }
    };
    Ok(Workload {
        kind: pk.kind,
        namespace,
        name,
        spec_path: pk.spec_field.clone(),
        claims,
        containers,
        replicas,
        placement,
        pod_names: None,
        group: None,
        pod_group,
        queue: controllers::queue_name(value).map(str::to_string),
        kueue_priority_class: kueue::priority_class_label(value).map(str::to_string),
        priority_class_name: spec
            .and_then(|s| s.get("priorityClassName"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string),
        created: value
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// Whether a VirtualMachine runs a VMI (and so a virt-launcher pod): `spec.runStrategy`
/// (`Halted` does not; `Always`, `RerunOnFailure`, `Manual`, `Once` do) or the older
/// `spec.running`.
fn vm_runs(value: &Value) -> Result<bool, FieldError> {
    let spec = value.get("spec");
    match (
        spec.and_then(|s| s.get("runStrategy")),
        spec.and_then(|s| s.get("running")),
    ) {
        (Some(Value::String(strategy)), None) => match strategy.as_str() {
            "Halted" => Ok(false),
            "Always" | "RerunOnFailure" | "Manual" | "Once" => Ok(true),
            other => Err(FieldError::new(
                "spec.runStrategy",
                format!(
                    "Unsupported value: {other:?}: supported values: \"Always\", \"Halted\", \"Manual\", \"RerunOnFailure\", \"Once\""
                ),
            )),
        },
        (None | Some(Value::Null), Some(Value::Bool(running))) => Ok(*running),
        (None | Some(Value::Null), None | Some(Value::Null)) => Ok(false),
        (Some(_), Some(_)) => Err(FieldError::new(
            "spec.running",
            "Invalid value: running and runStrategy are mutually exclusive",
        )),
        (Some(other), None) => Err(FieldError::new(
            "spec.runStrategy",
            format!("Invalid value: {other}: must be a string"),
        )),
        (_, Some(other)) => Err(FieldError::new(
            "spec.running",
            format!("Invalid value: {other}: must be a boolean"),
        )),
    }
}

/// KubeVirt's devices that take a claim (`domain.devices.gpus[]`, `hostDevices[]`): each with a
/// `claimName` names an entry of `resourceClaims` and gives a `requestName`, and has no
/// `deviceName` beside them (as KubeVirt's admission checks).
fn device_claim_refs(
    value: &Value,
    pk: &PodKind,
    claim_names: &HashSet<String>,
) -> Result<(), FieldError> {
    let devices = at_path(value, &pk.spec_path)
        .and_then(|s| s.get("domain"))
        .and_then(|d| d.get("devices"));
    for list in ["gpus", "hostDevices"] {
        let entries = match devices.and_then(|d| d.get(list)) {
            None | Some(Value::Null) => continue,
            Some(Value::Array(entries)) => entries,
            Some(_) => {
                return Err(FieldError::new(
                    format!("{}.domain.devices.{list}", pk.spec_field),
                    "must be a list",
                ));
            }
        };
        for (i, device) in entries.iter().enumerate() {
            let at = format!("{}.domain.devices.{list}[{i}]", pk.spec_field);
            let text = |key: &str| device.get(key).and_then(Value::as_str).unwrap_or("");
            let claim = text("claimName");
            if claim.is_empty() {
                continue;
            }
            if !text("deviceName").is_empty() {
                return Err(FieldError::new(
                    at,
                    "Invalid value: deviceName and claimName are mutually exclusive",
                ));
            }
            if !claim_names.contains(claim) {
                return Err(FieldError::new(
                    format!("{at}.claimName"),
                    format!(
                        "Invalid value: {claim:?}: no {}.resourceClaims entry has this name",
                        pk.spec_field
                    ),
                ));
            }
            if text("requestName").is_empty() {
                return Err(FieldError::new(
                    format!("{at}.requestName"),
                    "Required value: a device taken from a claim names its request",
                ));
            }
        }
    }
    Ok(())
}

/// The characters the API server's name generator appends (`names.SimpleNameGenerator`).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `n` name characters derived from `seed` (the API server picks them at random).
fn name_chars(seed: &str, n: usize) -> String {
    let mut out = String::with_capacity(n);
    let mut round = 0u32;
    while out.len() < n {
        let id = uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("{seed}#{round}").as_bytes(),
        );
        for b in id.as_bytes() {
            if out.len() == n {
                break;
            }
            out.push(char::from(
                NAME_ALPHABET[usize::from(*b) % NAME_ALPHABET.len()],
            ));
        }
        round += 1;
    }
    out
}

/// `generateName` as the API server completes it: the base cut to 58 bytes, 5 characters added.
fn generated_name(base: &str, seed: &str) -> String {
    format!("{}{}", truncate(base, 58), name_chars(seed, 5))
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn uid(seed: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, seed.as_bytes()).to_string()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: ml}
---
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: ml}
spec:
  metadata:
    labels: {team: ml}
  spec:
    devices:
      requests:
      - name: gpu
        deviceClassName: gpu.nvidia.com
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer, namespace: ml}
spec:
  replicas: 2
  template:
    spec:
      containers: [{name: c, image: x, resources: {claims: [{name: gpu}]}}]
      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: one-gpu
      - name: shared
        resourceClaimName: shared
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
"#;

    fn read(text: &str) -> Result<Manifests, ManifestError> {
        let mut m = Manifests::default();
        for doc in parse_text(text, "t.yaml")? {
            m.add_document(doc, None, None)?;
        }
        Ok(m)
    }

    #[test]
    fn a_deployment_gets_claims_per_replica_and_shares_named_ones() {
        let m = read(MANIFESTS).unwrap();
        assert_eq!(m.notes.len(), 1, "{:?}", m.notes);
        assert!(m.notes[0].starts_with("skipped Namespace ml (t.yaml, document 1): not a Pod"));
        let one = plan(&m, false, &[]).unwrap();
        assert_eq!(one.units.len(), 1);
        assert_eq!(one.units[0].claims.len(), 2);
        assert!(one.notes[0].contains("2 replicas, allocating one pod's claims"));
        let all = plan(&m, true, &[]).unwrap();
        assert_eq!(all.units.len(), 2);
        let generated: Vec<String> = all.generated.iter().map(claim_key).collect();
        assert_eq!(generated.len(), 2);
        assert_ne!(generated[0], generated[1]);
        let claim = &all.generated[0];
        let pod = &claim.metadata.owner_references.as_ref().unwrap()[0].name;
        assert!(pod.starts_with("trainer-"), "{pod}");
        assert!(
            claim
                .metadata
                .name
                .as_deref()
                .unwrap()
                .starts_with(&format!("{pod}-gpu-"))
        );
        assert_eq!(
            claim.metadata.labels.as_ref().unwrap()["team"],
            "ml",
            "template labels are copied"
        );
        assert_eq!(
            claim.metadata.annotations.as_ref().unwrap()[POD_CLAIM_NAME_ANNOTATION],
            "gpu"
        );
        // The shared claim is in both pods' units, under its own name.
        for unit in &all.units {
            assert!(unit.claims.iter().any(|c| claim_key(c) == "ml/shared"));
        }
    }

    #[test]
    fn a_missing_template_names_the_pod_and_field() {
        let text = MANIFESTS.replace(
            "resourceClaimTemplateName: one-gpu",
            "resourceClaimTemplateName: two-gpus",
        );
        let err = plan(&read(&text).unwrap(), false, &[])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "Deployment ml/trainer (t.yaml, document 3): spec.template.spec.resourceClaims[0].resourceClaimTemplateName: ResourceClaimTemplate ml/two-gpus is not in the inputs (give it with -f)"
        );
    }

    #[test]
    fn long_names_are_cut_like_the_controller_does() {
        let template = ResourceClaimTemplate::default();
        let pod = "a".repeat(60);
        let claim = claim_from_template(&pod, "uid", "default", "gpu-claim", &template);
        let generate_name = claim.metadata.generate_name.unwrap();
        // 57 * 60 / 71 = 48 and 57 * 9 / 71 = 7, joined by '-'.
        assert_eq!(generate_name, format!("{}-gpu-cla", "a".repeat(48)));
        assert_eq!(claim.metadata.name.unwrap().len(), generate_name.len() + 5);
    }

    #[test]
    fn lists_and_json_streams_keep_document_numbers() {
        let docs = parse_text(
            r#"{"kind": "List", "apiVersion": "v1", "items": [{"kind": "A"}, {"kind": "B"}]} {"kind": "C"}"#,
            "f.json",
        )
        .unwrap();
        let origins: Vec<String> = docs.iter().map(|d| d.origin.to_string()).collect();
        assert_eq!(
            origins,
            [
                "f.json, document 1, item 1",
                "f.json, document 1, item 2",
                "f.json, document 2"
            ]
        );
    }

    /// A JSON List of slices, as `kubectl get resourceslices -o json` writes a fleet's: read on
    /// threads, straight from the text where that reads the same, in input order.
    fn slice_list(items: &[String]) -> String {
        format!(
            r#"{{"apiVersion": "v1", "kind": "List", "items": [{}]}}"#,
            items.join(",")
        )
    }

    fn slice_item(i: usize, memory: &str, extra: &str) -> String {
        format!(
            r#"{{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {{"name": "s-{i}"}},
                "spec": {{"driver": "gpu.nvidia.com", "nodeName": "n-{i}",
                  "pool": {{"name": "n-{i}", "generation": 1, "resourceSliceCount": 1}},
                  "devices": [{{"name": "gpu-0", "capacity": {{"memory": {memory}}}{extra}}}]}}}}"#
        )
    }

    #[test]
    fn a_list_of_many_slices_reads_as_one_reader_would() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("fleet.json");
        // Item 41 omits its capacity's value (Go reads 0), so it takes the general path.
        let items: Vec<String> = (0..100)
            .map(|i| match i {
                40 => slice_item(i, "{}", ""),
                _ => slice_item(i, r#"{"value": "80Gi"}"#, ""),
            })
            .collect();
        std::fs::write(&path, slice_list(&items)).expect("write");
        let mut m = Manifests::default();
        m.add_typed(std::slice::from_ref(&path), Kind::ResourceSlice)
            .expect("read");
        assert_eq!(m.slices.len(), 100);
        for (i, entry) in m.slices.iter().enumerate() {
            assert_eq!(
                entry.object.metadata.name.as_deref(),
                Some(format!("s-{i}").as_str())
            );
            assert_eq!(entry.seq, i);
            assert_eq!(entry.origin.item, Some(i + 1));
            let devices = entry.object.spec.devices.as_deref().unwrap_or_default();
            let value = &devices[0].capacity.as_ref().expect("capacity")["memory"]
                .value
                .0;
            assert_eq!(value, if i == 40 { "0" } else { "80Gi" }, "slice {i}");
        }
    }

    #[test]
    fn a_bad_item_in_a_long_list_is_named_by_its_number() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("fleet.json");
        let items: Vec<String> = (0..100)
            .map(|i| match i {
                // Both threads' shares hold a bad item: the first in input order is reported.
                70 => slice_item(i, r#"{"value": "80Gi"}"#, r#", "colour": "red""#),
                80 => slice_item(i, r#"{"value": "lots"}"#, ""),
                _ => slice_item(i, r#"{"value": "80Gi"}"#, ""),
            })
            .collect();
        std::fs::write(&path, slice_list(&items)).expect("write");
        let mut m = Manifests::default();
        let err = m
            .add_typed(std::slice::from_ref(&path), Kind::ResourceSlice)
            .expect_err("unknown field")
            .to_string();
        assert!(err.contains("ResourceSlice s-70"), "{err}");
        assert!(err.contains("item 71"), "{err}");
        assert!(err.contains("colour"), "{err}");
    }

    #[test]
    fn a_bad_device_field_is_named_by_its_full_path() {
        // Devices are checked without paths first; the one that fails is named in full.
        let text = r#"{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n",
              "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
              "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}},
                          {"name": "gpu-1", "capacity": {"memory": {"value": "lots"}}}]}}"#;
        let err = read(text).expect_err("bad quantity").to_string();
        assert!(
            err.contains("spec.devices[1].capacity[memory].value"),
            "{err}"
        );
    }
}
