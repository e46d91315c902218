//! `gpu-dra explain job/NAME` (and `jobset/`, `mpijob/`, `leaderworkerset/`, `podgroup/`) on a
//! live cluster: what stops a queued or gang-pending workload. Kueue first: when a Kueue
//! Workload stands for the object and is not admitted, its LocalQueue, ClusterQueue and Kueue's
//! own reason (the quota resource and how much is missing) are the answer. Otherwise its pods:
//! those bound, and the pending ones as new copies, explained in turn by the offline explainer,
//! each with the devices the ones before it would take; so the pod of a gang that cannot fit is
//! named, with why.
use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

use super::{Snapshot, api_error, pod_documents, view};
use crate::cli::CliError;
use crate::cli::manifests::{Doc, Origin};

/// A workload kind `explain` reads: where it is served and how its pods are found.
#[derive(Debug, PartialEq, Eq)]
pub struct WorkloadKind {
    pub kind: &'static str,
    api_version: &'static str,
    plural: &'static str,
    /// The label its controller puts on its pods, with the object's name as value; `None`:
    /// pods name it in `spec.schedulingGroup.podGroupName` (a PodGroup).
    pod_label: Option<&'static str>,
    /// Where its `suspend` flag is (Kueue suspends what it has not admitted).
    suspend: &'static [&'static str],
}

const KINDS: &[(&[&str], WorkloadKind)] = &[
    (
        &["job", "jobs", "job.batch", "jobs.batch"],
        WorkloadKind {
            kind: "Job",
            api_version: "batch/v1",
            plural: "jobs",
            pod_label: Some("batch.kubernetes.io/job-name"),
            suspend: &["spec", "suspend"],
        },
    ),
    (
        &["jobset", "jobsets"],
        WorkloadKind {
            kind: "JobSet",
            api_version: "jobset.x-k8s.io/v1alpha2",
            plural: "jobsets",
            pod_label: Some("jobset.sigs.k8s.io/jobset-name"),
            suspend: &["spec", "suspend"],
        },
    ),
    (
        &["mpijob", "mpijobs"],
        WorkloadKind {
            kind: "MPIJob",
            api_version: "kubeflow.org/v2beta1",
            plural: "mpijobs",
            pod_label: Some("training.kubeflow.org/job-name"),
            suspend: &["spec", "runPolicy", "suspend"],
        },
    ),
    (
        &["leaderworkerset", "leaderworkersets", "lws"],
        WorkloadKind {
            kind: "LeaderWorkerSet",
            api_version: "leaderworkerset.x-k8s.io/v1",
            plural: "leaderworkersets",
            pod_label: Some("leaderworkerset.sigs.k8s.io/name"),
            suspend: &[],
        },
    ),
    (
        &["podgroup", "podgroups"],
        WorkloadKind {
            kind: "PodGroup",
            api_version: "scheduling.k8s.io/v1beta1",
            plural: "podgroups",
            pod_label: None,
            suspend: &[],
        },
    ),
];

/// The workload kind `kubectl` would take `name` (`job`, `jobs.batch`, `lws`, ...) for.
pub fn kind_named(name: &str) -> Option<&'static WorkloadKind> {
    KINDS
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, kind)| kind)
}

fn resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}

/// What the cluster says of the workload.
pub enum Reading {
    /// Nothing to allocate: Kueue holds it, it is suspended, it has no pods yet, or all bound.
    /// The lines say which; `stopped` when it does not run (exit 1).
    Settled { lines: Vec<String>, stopped: bool },
    /// Pending pods: the lines so far, and the cluster with those pods (as new copies) as
    /// documents, for the offline explainer.
    Pending {
        lines: Vec<String>,
        snapshot: Snapshot,
    },
}

/// Reads `kind/name` in `namespace`: Kueue's Workload for it, then its pods.
pub fn read(
    kubeconfig: Option<&Path>,
    namespace: &str,
    kind: &WorkloadKind,
    name: &str,
) -> Result<Reading, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(read_async(kubeconfig, namespace, kind, name))
}

async fn read_async(
    kubeconfig: Option<&Path>,
    namespace: &str,
    kind: &WorkloadKind,
    name: &str,
) -> Result<Reading, CliError> {
    let client = crate::node::kube_client(kubeconfig, &crate::kubeapi::ApiTimeouts::default())
        .await
        .map_err(|e| CliError::Node(Box::new(e)))?;
    let title = format!("{} {namespace}/{name}", kind.kind);
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &resource(kind.api_version, kind.kind, kind.plural),
    );
    let object = api.get(name).await.map_err(|e| {
        api_error(
            &format!(
                "get {} {namespace}/{name} ({})",
                kind.plural, kind.api_version
            ),
            e,
        )
    })?;
    let uid = object.metadata.uid.clone().unwrap_or_default();
    let mut lines = Vec::new();
    match kueue_workload(&client, namespace, kind.kind, name, &uid).await? {
        Some(workload) => {
            let (admitted, said) = kueue_verdict(&client, namespace, &workload).await;
            lines.push(format!("{title}: {said}"));
            if !admitted {
                return Ok(Reading::Settled {
                    lines,
                    stopped: true,
                });
            }
        }
        None => {
            let suspended = !kind.suspend.is_empty()
                && kind
                    .suspend
                    .iter()
                    .try_fold(&object.data, |v, key| v.get(key))
                    .and_then(Value::as_bool)
                    == Some(true);
            if suspended {
                lines.push(format!(
                    "{title}: {} is true and no Kueue Workload stands for it: its controller makes no pods until something unsuspends it",
                    kind.suspend.join(".")
                ));
                return Ok(Reading::Settled {
                    lines,
                    stopped: true,
                });
            }
        }
    }
    let pods = pods_of(&client, namespace, kind, name).await?;
    let (bound, pending): (Vec<&Pod>, Vec<&Pod>) = pods.iter().partition(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    });
    let names = |pods: &[&Pod]| -> String {
        pods.iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if pods.is_empty() {
        lines.push(format!(
            "{title}: no pods yet: its controller has not made them (nothing to allocate)"
        ));
        return Ok(Reading::Settled {
            lines,
            stopped: true,
        });
    }
    if pending.is_empty() {
        lines.push(format!(
            "{title}: all {} pods bound ({})",
            pods.len(),
            names(&bound)
        ));
        return Ok(Reading::Settled {
            lines,
            stopped: false,
        });
    }
    lines.push(format!(
        "{title}: {} of {} pods bound{}; pending: {}. Each pending pod below is explained with the devices of the ones before it taken, as the scheduler would place them one by one",
        bound.len(),
        pods.len(),
        if bound.is_empty() {
            String::new()
        } else {
            format!(" ({})", names(&bound))
        },
        names(&pending)
    ));
    let mut docs: Vec<Doc> = Vec::new();
    // Templates and claims several pods name are given once.
    let mut seen = BTreeSet::new();
    let mut groups = BTreeSet::new();
    for pod in &pending {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        if let Some(group) = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_group.as_ref())
            .and_then(|g| g.pod_group_name.clone())
        {
            groups.insert(group);
        }
        for doc in pod_documents(&client, namespace, &pod_name).await? {
            let key = (
                doc.value["kind"].as_str().unwrap_or_default().to_string(),
                doc.value
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            );
            if key.0 == "Pod" || seen.insert(key) {
                docs.push(doc);
            }
        }
    }
    // The PodGroups the pods name, for the claims the group shares.
    let groups_api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &resource("scheduling.k8s.io/v1beta1", "PodGroup", "podgroups"),
    );
    for group in groups {
        let object = groups_api
            .get(&group)
            .await
            .map_err(|e| api_error(&format!("get podgroups {namespace}/{group}"), e))?;
        let mut value =
            serde_json::to_value(&object).map_err(|e| CliError::Encode(e.to_string()))?;
        value["apiVersion"] = "scheduling.k8s.io/v1beta1".into();
        value["kind"] = "PodGroup".into();
        if let Some(fields) = value.as_object_mut() {
            fields.remove("status");
        }
        docs.push(Doc {
            value,
            origin: Origin {
                file: format!("podgroup {namespace}/{group} in the cluster").into(),
                document: 0,
                item: None,
            },
        });
    }
    // The pending pods' own claims (made, not allocated) are theirs to allocate again.
    Ok(Reading::Pending {
        lines,
        snapshot: Snapshot::from_view(view(&client).await?, docs),
    })
}

/// The pods of the workload: by its controller's label, or (a PodGroup) those naming it.
async fn pods_of(
    client: &kube::Client,
    namespace: &str,
    kind: &WorkloadKind,
    name: &str,
) -> Result<Vec<Pod>, CliError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = match kind.pod_label {
        Some(label) => ListParams::default().labels(&format!("{label}={name}")),
        None => ListParams::default(),
    };
    let mut pods: Vec<Pod> = api
        .list(&params)
        .await
        .map_err(|e| api_error(&format!("list pods in {namespace}"), e))?
        .items
        .into_iter()
        .filter(|p| {
            kind.pod_label.is_some()
                || p.spec
                    .as_ref()
                    .and_then(|s| s.scheduling_group.as_ref())
                    .and_then(|g| g.pod_group_name.as_deref())
                    == Some(name)
        })
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(pods)
}

const KUEUE_VERSION: &str = "kueue.x-k8s.io/v1beta2";

/// The Kueue Workload standing for the object, if Kueue is installed and made one.
async fn kueue_workload(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    name: &str,
    uid: &str,
) -> Result<Option<DynamicObject>, CliError> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &resource(KUEUE_VERSION, "Workload", "workloads"),
    );
    let workloads = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // Kueue is not installed: nothing queues the workload.
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
        Err(e) => {
            return Err(api_error(
                &format!("list workloads.kueue.x-k8s.io in {namespace}"),
                e,
            ));
        }
    };
    Ok(workloads.into_iter().find(|w| {
        w.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == kind && o.name == name && (uid.is_empty() || o.uid == uid))
    }))
}

/// Whether Kueue admitted the Workload, and what it says, in its own words: the ClusterQueue
/// (through the LocalQueue) and the condition that holds it.
async fn kueue_verdict(
    client: &kube::Client,
    namespace: &str,
    workload: &DynamicObject,
) -> (bool, String) {
    let data = &workload.data;
    let condition = |kind: &str| {
        data.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| c["type"] == kind))
            .cloned()
    };
    let status = |c: &Option<Value>| {
        c.as_ref()
            .and_then(|c| c["status"].as_str())
            .unwrap_or("Unknown")
            .to_string()
    };
    let queue = data
        .pointer("/spec/queueName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let admitted_to = data
        .pointer("/status/admission/clusterQueue")
        .and_then(Value::as_str)
        .map(str::to_string);
    let admitted = condition("Admitted");
    if status(&admitted) == "True" {
        return (
            true,
            format!(
                "Kueue admitted it (LocalQueue {namespace}/{queue}, ClusterQueue {})",
                admitted_to.unwrap_or_default()
            ),
        );
    }
    // The ClusterQueue the LocalQueue feeds; unread (e.g. no permission) it stays unnamed.
    let local: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &resource(KUEUE_VERSION, "LocalQueue", "localqueues"),
    );
    let cluster_queue = match local.get(&queue).await {
        Ok(lq) => lq
            .data
            .pointer("/spec/clusterQueue")
            .and_then(Value::as_str)
            .map(|c| format!("ClusterQueue {c}"))
            .unwrap_or_else(|| "no ClusterQueue".into()),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            "the LocalQueue does not exist".to_string()
        }
        Err(e) => format!("its ClusterQueue unread: {e}"),
    };
    let reserved = condition("QuotaReserved");
    let why = reserved
        .as_ref()
        .filter(|_| status(&reserved) == "False")
        .or(admitted.as_ref())
        .and_then(|c| c["message"].as_str())
        .filter(|m| !m.is_empty())
        .unwrap_or("Kueue has not decided on it yet");
    (
        false,
        format!(
            "Kueue holds it (LocalQueue {namespace}/{queue}, {cluster_queue}; Workload {}): {why}",
            workload.metadata.name.as_deref().unwrap_or_default()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_named_as_kubectl_names_them() {
        assert_eq!(kind_named("jobs.batch").map(|k| k.kind), Some("Job"));
        assert_eq!(kind_named("lws").map(|k| k.kind), Some("LeaderWorkerSet"));
        assert_eq!(kind_named("podgroup").map(|k| k.kind), Some("PodGroup"));
        assert!(kind_named("deployment").is_none());
        let r = resource("batch/v1", "Job", "jobs");
        assert_eq!((r.group.as_str(), r.version.as_str()), ("batch", "v1"));
    }
}
