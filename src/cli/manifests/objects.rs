//! What each document adds to [`Manifests`]: its kind read, converted to v1 and checked as
//! the API server would, workloads' pod specs read, other kinds noted and skipped.
use std::path::PathBuf;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::convert::{FieldError, Kind, V1Object, Version};
use super::documents::{
    Pending, PendingDoc, for_each_document, for_each_text, parse_pending, slice_from_text,
};
use super::names::{generated_name, name_chars};
use super::workload::{PodKind, parse_workload, pod_kind};
use super::{DEFAULT_NAMESPACE, Group, Replicas, Workload};
use super::{Doc, Entry, ManifestError, Manifests, Origin, field_error, raw_identity};
use super::{controllers, convert, kueue, pod_group, taint_rules, validate, validate_slice};

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

    pub(super) fn add_document(
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
            // Its value orders Kueue's queues only: said, so it is not taken for more.
            if kind == "PriorityClass" {
                self.notes.push(format!(
                    "{object} ({origin}): read for Kueue's queue order only; kube-scheduler's priority and preemption are not predicted"
                ));
            }
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
pub(super) fn name_object(
    meta: &mut ObjectMeta,
    namespaced: bool,
    origin: &Origin,
) -> Result<(), FieldError> {
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
pub(super) fn template_metadata(meta: Option<&ObjectMeta>) -> Result<(), FieldError> {
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
