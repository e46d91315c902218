//! The pods a workload controller makes from its object: JobSet, LeaderWorkerSet, the MPI
//! operator's MPIJob (`kubeflow.org/v2beta1`) and the training operator's jobs (MPIJob
//! `kubeflow.org/v1`, PyTorchJob, TFJob, XGBoostJob, PaddleJob, JAXJob), and Volcano's Job
//! (`batch.volcano.sh`). Each pod template is a [`Role`] with the names its controller gives
//! the pods; a [`Gang`] says how many must bind together (Volcano's `minAvailable`, the
//! operators' `schedulingPolicy`). Counts, defaults and names follow each controller's code
//! (jobset v0.10.1, lws v0.7.0, mpi-operator v0.6.0, training-operator v1.9, volcano v1.13);
//! `e2e/workloads.sh` holds JobSet, LWS and MPIJob v2beta1 to the controllers themselves
//! (jobset v0.11.1, lws v0.8.0, mpi-operator v0.8.0, the versions Kueue v0.17 integrates with).
use serde_json::Value;

use super::convert::FieldError;

/// The label Kueue queues a workload by; its webhook suspends the workload until admitted.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// One pod template of a workload object and the pods made from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    /// `launcher`, `worker`, a replicated job's or task's name: names the role's workload.
    pub name: String,
    /// Path of the pod spec in the object, and that path as a field (`spec.tasks[0]...`).
    pub spec_path: Vec<String>,
    pub spec_field: String,
    /// The pods, named as the controller names them, in the order it makes them.
    pub pods: Vec<String>,
}

/// All-or-nothing binding: none of the workload's pods bind until `min_count` of them fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gang {
    pub min_count: u64,
    /// Which field or rule set it (`spec.minAvailable`, ...).
    pub by: String,
}

/// What a controller makes of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expansion {
    pub kind: &'static str,
    pub roles: Vec<Role>,
    pub gang: Option<Gang>,
    /// How it was read (suspension, queueing), one line each.
    pub notes: Vec<String>,
}

/// The API versions each kind is served at, for messages.
fn served(kind: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match kind {
        "JobSet" => ("JobSet", &["jobset.x-k8s.io/v1alpha2"]),
        "LeaderWorkerSet" => ("LeaderWorkerSet", &["leaderworkerset.x-k8s.io/v1"]),
        "MPIJob" => ("MPIJob", &["kubeflow.org/v2beta1", "kubeflow.org/v1"]),
        "PyTorchJob" => ("PyTorchJob", &["kubeflow.org/v1"]),
        "TFJob" => ("TFJob", &["kubeflow.org/v1"]),
        "XGBoostJob" => ("XGBoostJob", &["kubeflow.org/v1"]),
        "PaddleJob" => ("PaddleJob", &["kubeflow.org/v1"]),
        "JAXJob" => ("JAXJob", &["kubeflow.org/v1"]),
        // Volcano's own Job, not batch/v1's.
        "Job" => ("Job", &["batch.volcano.sh/v1alpha1"]),
        _ => return None,
    })
}

/// Whether `kind` at `api_version` is a controller's object this module expands. An unknown
/// version of a known controller kind is one too (and an error from [`expand`]), except batch/v1
/// Jobs, which are not Volcano's.
pub fn handles(kind: &str, api_version: &str) -> bool {
    match served(kind) {
        Some(("Job", _)) => api_version.starts_with("batch.volcano.sh/"),
        Some(_) => true,
        None => false,
    }
}

/// The pods `value` (of `kind`, named `name`) makes. `suffix(seed)` gives the five random
/// characters a generated name ends with, stable per seed.
pub fn expand(
    kind: &str,
    api_version: &str,
    value: &Value,
    name: &str,
    suffix: &dyn Fn(&str) -> String,
) -> Result<Expansion, FieldError> {
    let Some((kind, versions)) = served(kind) else {
        return Err(FieldError::new(
            "kind",
            format!("{kind:?} is not a controller kind"),
        ));
    };
    if !versions.contains(&api_version) {
        return Err(FieldError::new(
            "apiVersion",
            format!(
                "{api_version:?} does not serve {kind}; use {}",
                versions.join(" or ")
            ),
        ));
    }
    let mut expansion = match (kind, api_version) {
        ("JobSet", _) => jobset(value, name, suffix)?,
        ("LeaderWorkerSet", _) => leader_worker_set(value, name)?,
        ("MPIJob", "kubeflow.org/v2beta1") => mpi_job_v2(value, name, suffix)?,
        ("Job", _) => volcano_job(value, name)?,
        _ => training_job(kind, value, name)?,
    };
    expansion.kind = kind;
    suspension(kind, value, &mut expansion)?;
    Ok(expansion)
}

/// Suspended objects run no pods, except those Kueue holds until it admits them: those are
/// read as admitted (the question is whether they fit once admitted).
fn suspension(kind: &str, value: &Value, expansion: &mut Expansion) -> Result<(), FieldError> {
    let path: &[&str] = match kind {
        "JobSet" => &["spec", "suspend"],
        "MPIJob" | "PyTorchJob" | "TFJob" | "XGBoostJob" | "PaddleJob" | "JAXJob" => {
            &["spec", "runPolicy", "suspend"]
        }
        _ => return Ok(()),
    };
    let suspended = match at(value, path) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(FieldError::new(
                path.join("."),
                format!("Invalid value: {other}: must be a boolean"),
            ));
        }
    };
    if !suspended {
        return Ok(());
    }
    let field = path.join(".");
    match queue_name(value) {
        Some(queue) => expansion.notes.push(format!(
            "{field} is true and Kueue queues it (LocalQueue {queue:?}): read as admitted"
        )),
        None => {
            expansion.notes.push(format!(
                "{field} is true and no Kueue queue ({KUEUE_QUEUE_LABEL}) admits it: its controller makes no pods"
            ));
            expansion.roles.iter_mut().for_each(|r| r.pods.clear());
        }
    }
    Ok(())
}

/// The LocalQueue a Kueue-managed object names.
pub fn queue_name(value: &Value) -> Option<&str> {
    value
        .pointer("/metadata/labels")
        .and_then(|l| l.get(KUEUE_QUEUE_LABEL))
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
}

/// Follows `path` through objects, and arrays by index.
pub fn at<'a, S: AsRef<str>>(value: &'a Value, path: &[S]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| match v {
        Value::Array(items) => key
            .as_ref()
            .parse::<usize>()
            .ok()
            .and_then(|i| items.get(i)),
        _ => v.get(key.as_ref()),
    })
}

/// A non-negative integer field, `default` when absent or null.
fn count(value: &Value, path: &[&str], field: &str, default: u64) -> Result<u64, FieldError> {
    match at(value, path) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_u64().ok_or_else(|| {
            FieldError::new(
                field,
                format!("Invalid value: {v}: must be greater than or equal to 0"),
            )
        }),
    }
}

fn strings(path: &[&str]) -> Vec<String> {
    path.iter().map(|s| s.to_string()).collect()
}

/// JobSet: each replicated job makes `replicas` Indexed Jobs `<jobset>-<rjob>-<i>`, each with
/// min(parallelism, completions) pods `<job>-<index>-<random>` (the Job controller's names).
fn jobset(
    value: &Value,
    name: &str,
    suffix: &dyn Fn(&str) -> String,
) -> Result<Expansion, FieldError> {
    let jobs = match at(value, &["spec", "replicatedJobs"]) {
        Some(Value::Array(jobs)) if !jobs.is_empty() => jobs,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(FieldError::new("spec.replicatedJobs", "Required value"));
        }
        Some(_) => return Err(FieldError::new("spec.replicatedJobs", "must be a list")),
    };
    let mut roles = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let at_job = format!("spec.replicatedJobs[{i}]");
        let rjob = job
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| FieldError::new(format!("{at_job}.name"), "Required value"))?;
        let replicas = count(job, &["replicas"], &format!("{at_job}.replicas"), 1)?;
        let per_job = pods_per_job(
            job,
            &["template", "spec"],
            &format!("{at_job}.template.spec"),
        )?;
        let mut pods = Vec::new();
        for j in 0..replicas {
            let job_name = format!("{name}-{rjob}-{j}");
            for p in 0..per_job {
                let base = format!("{job_name}-{p}-");
                pods.push(format!("{base}{}", suffix(&base)));
            }
        }
        let index = i.to_string();
        roles.push(Role {
            name: rjob.to_string(),
            spec_path: strings(&[
                "spec",
                "replicatedJobs",
                &index,
                "template",
                "spec",
                "template",
                "spec",
            ]),
            spec_field: format!("{at_job}.template.spec.template.spec"),
            pods,
        });
    }
    Ok(Expansion {
        kind: "JobSet",
        roles,
        gang: None,
        notes: vec![],
    })
}

/// Pods of a Job spec that run at once: min(parallelism, completions), parallelism 1 by default.
pub fn pods_per_job(value: &Value, spec: &[&str], field: &str) -> Result<u64, FieldError> {
    let with = |key: &'static str| [spec, &[key]].concat();
    let parallelism = count(
        value,
        &with("parallelism"),
        &format!("{field}.parallelism"),
        1,
    )?;
    let completions = count(
        value,
        &with("completions"),
        &format!("{field}.completions"),
        u64::MAX,
    )?;
    Ok(parallelism.min(completions))
}

/// LeaderWorkerSet: `replicas` groups of `size` pods; the leader StatefulSet's pods `<lws>-<g>`,
/// each leader's worker StatefulSet's pods `<lws>-<g>-<w>` (w from 1). The leader uses the
/// worker template when it has none of its own.
fn leader_worker_set(value: &Value, name: &str) -> Result<Expansion, FieldError> {
    let groups = count(value, &["spec", "replicas"], "spec.replicas", 1)?;
    let template = &["spec", "leaderWorkerTemplate"];
    let size = count(
        value,
        &["spec", "leaderWorkerTemplate", "size"],
        "spec.leaderWorkerTemplate.size",
        1,
    )?;
    if size == 0 {
        return Err(FieldError::new(
            "spec.leaderWorkerTemplate.size",
            "Invalid value: 0: must be greater than or equal to 1",
        ));
    }
    if at(value, &[template[0], template[1], "workerTemplate"]).is_none_or(Value::is_null) {
        return Err(FieldError::new(
            "spec.leaderWorkerTemplate.workerTemplate",
            "Required value",
        ));
    }
    let has_leader =
        at(value, &[template[0], template[1], "leaderTemplate"]).is_some_and(|t| !t.is_null());
    let leader_template = if has_leader {
        "leaderTemplate"
    } else {
        "workerTemplate"
    };
    let role = |role: &str, template: &str, pods: Vec<String>| Role {
        name: role.to_string(),
        spec_path: strings(&["spec", "leaderWorkerTemplate", template, "spec"]),
        spec_field: format!("spec.leaderWorkerTemplate.{template}.spec"),
        pods,
    };
    let leaders = (0..groups).map(|g| format!("{name}-{g}")).collect();
    let workers = (0..groups)
        .flat_map(|g| (1..size).map(move |w| format!("{name}-{g}-{w}")))
        .collect();
    Ok(Expansion {
        kind: "LeaderWorkerSet",
        roles: vec![
            role("leader", leader_template, leaders),
            role("worker", "workerTemplate", workers),
        ],
        gang: None,
        notes: vec![],
    })
}

/// The replica specs of a training job (`<field>.<Type>`), known types first in `order`.
fn replica_specs<'a>(
    value: &'a Value,
    field: &str,
    order: &[&str],
) -> Result<Vec<(&'a str, &'a Value)>, FieldError> {
    let specs = match value.pointer(&format!("/spec/{field}")) {
        Some(Value::Object(specs)) if !specs.is_empty() => specs,
        Some(Value::Object(_)) | None | Some(Value::Null) => {
            return Err(FieldError::new(format!("spec.{field}"), "Required value"));
        }
        Some(_) => {
            return Err(FieldError::new(
                format!("spec.{field}"),
                "must be an object",
            ));
        }
    };
    let mut out: Vec<(&str, &Value)> = specs
        .iter()
        .filter(|(_, spec)| !spec.is_null())
        .map(|(role, spec)| (role.as_str(), spec))
        .collect();
    // The launcher or master first: the pod the others wait for; then by name.
    out.sort_by_key(|(role, _)| {
        (
            order.iter().position(|o| o == role).unwrap_or(order.len()),
            role.to_string(),
        )
    });
    Ok(out)
}

/// MPIJob v2beta1 (the MPI operator): the launcher is a Job `<job>-launcher` (its pod
/// `<job>-launcher-<random>`); workers are pods `<job>-worker-<i>`, none by default. A
/// launcher without devices is still a pod of the job.
fn mpi_job_v2(
    value: &Value,
    name: &str,
    suffix: &dyn Fn(&str) -> String,
) -> Result<Expansion, FieldError> {
    let specs = replica_specs(value, "mpiReplicaSpecs", &["Launcher", "Worker"])?;
    let mut roles = Vec::new();
    let mut workers = 0;
    for (role, spec) in specs {
        let field = format!("spec.mpiReplicaSpecs.{role}");
        let pods = match role {
            "Launcher" => {
                let replicas = count(spec, &["replicas"], &format!("{field}.replicas"), 1)?;
                if replicas != 1 {
                    return Err(FieldError::new(
                        format!("{field}.replicas"),
                        format!("Invalid value: {replicas}: must be 1"),
                    ));
                }
                let base = format!("{name}-launcher-");
                vec![format!("{base}{}", suffix(&base))]
            }
            "Worker" => {
                workers = count(spec, &["replicas"], &format!("{field}.replicas"), 0)?;
                (0..workers).map(|i| format!("{name}-worker-{i}")).collect()
            }
            other => {
                return Err(FieldError::new(
                    format!("spec.mpiReplicaSpecs.{other}"),
                    "not a role of MPIJob kubeflow.org/v2beta1 (Launcher, Worker)",
                ));
            }
        };
        roles.push(replica_role(role, "mpiReplicaSpecs", pods));
    }
    if !roles.iter().any(|r| r.name == "launcher") {
        return Err(FieldError::new(
            "spec.mpiReplicaSpecs.Launcher",
            "Required value",
        ));
    }
    let gang = scheduling_gang(value, workers + 1, "the launcher and every worker")?;
    Ok(Expansion {
        kind: "MPIJob",
        roles,
        gang,
        notes: vec![],
    })
}

fn replica_role(role: &str, field: &str, pods: Vec<String>) -> Role {
    Role {
        name: role.to_lowercase(),
        spec_path: strings(&["spec", field, role, "template", "spec"]),
        spec_field: format!("spec.{field}.{role}.template.spec"),
        pods,
    }
}

/// The training operator's jobs (MPIJob v1, PyTorchJob, TFJob, ...): replica types, each with
/// pods `<job>-<type>-<i>` (replicas 1 by default; an MPIJob's workers 0 and its launcher the
/// pod `<job>-launcher`).
fn training_job(kind: &str, value: &Value, name: &str) -> Result<Expansion, FieldError> {
    let (field, order, known): (&str, &[&str], &[&str]) = match kind {
        "MPIJob" => (
            "mpiReplicaSpecs",
            &["Launcher", "Worker"],
            &["Launcher", "Worker"],
        ),
        "PyTorchJob" => (
            "pytorchReplicaSpecs",
            &["Master", "Worker"],
            &["Master", "Worker"],
        ),
        "TFJob" => (
            "tfReplicaSpecs",
            &["Chief", "Master", "PS", "Worker", "Evaluator"],
            &["Chief", "Master", "PS", "Worker", "Evaluator"],
        ),
        "XGBoostJob" => (
            "xgbReplicaSpecs",
            &["Master", "Worker"],
            &["Master", "Worker"],
        ),
        "PaddleJob" => (
            "paddleReplicaSpecs",
            &["Master", "Worker"],
            &["Master", "Worker"],
        ),
        _ => ("jaxReplicaSpecs", &["Worker"], &["Worker"]),
    };
    let mut roles = Vec::new();
    let mut total = 0;
    for (role, spec) in replica_specs(value, field, order)? {
        if !known.contains(&role) {
            return Err(FieldError::new(
                format!("spec.{field}.{role}"),
                format!("not a role of {kind} ({})", known.join(", ")),
            ));
        }
        let default = u64::from(!(kind == "MPIJob" && role == "Worker"));
        let replicas = count(
            spec,
            &["replicas"],
            &format!("spec.{field}.{role}.replicas"),
            default,
        )?;
        total += replicas;
        let lower = role.to_lowercase();
        let pods = if kind == "MPIJob" && role == "Launcher" {
            vec![format!("{name}-launcher")]
        } else {
            (0..replicas)
                .map(|i| format!("{name}-{lower}-{i}"))
                .collect()
        };
        roles.push(replica_role(role, field, pods));
    }
    let gang = scheduling_gang(value, total, "every replica")?;
    Ok(Expansion {
        kind: "",
        roles,
        gang,
        notes: vec![],
    })
}

/// `spec.runPolicy.schedulingPolicy`: set, the operator makes a PodGroup for a gang scheduler
/// (Volcano, the coscheduling plugin) of `minAvailable` pods, by default `default` (`what`).
fn scheduling_gang(value: &Value, default: u64, what: &str) -> Result<Option<Gang>, FieldError> {
    let policy = &["spec", "runPolicy", "schedulingPolicy"];
    if at(value, policy).is_none_or(Value::is_null) {
        return Ok(None);
    }
    let field = "spec.runPolicy.schedulingPolicy.minAvailable";
    Ok(Some(
        match count(
            value,
            &[policy[0], policy[1], policy[2], "minAvailable"],
            field,
            0,
        )? {
            0 => Gang {
                min_count: default,
                by: format!("spec.runPolicy.schedulingPolicy (all {default} pods: {what})"),
            },
            n => Gang {
                min_count: n,
                by: field.to_string(),
            },
        },
    ))
}

/// Volcano's Job: tasks of `replicas` pods `<job>-<task>-<i>`, bound as one gang of
/// `spec.minAvailable` pods (by default, every task's `minAvailable`, itself its replicas).
fn volcano_job(value: &Value, name: &str) -> Result<Expansion, FieldError> {
    let tasks = match at(value, &["spec", "tasks"]) {
        Some(Value::Array(tasks)) if !tasks.is_empty() => tasks,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(FieldError::new("spec.tasks", "Required value"));
        }
        Some(_) => return Err(FieldError::new("spec.tasks", "must be a list")),
    };
    let mut roles = Vec::new();
    let mut task_min = 0;
    for (i, task) in tasks.iter().enumerate() {
        let field = format!("spec.tasks[{i}]");
        let task_name = match task.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => format!("default{i}"),
        };
        let replicas = count(task, &["replicas"], &format!("{field}.replicas"), 0)?;
        task_min += count(
            task,
            &["minAvailable"],
            &format!("{field}.minAvailable"),
            replicas,
        )?;
        let index = i.to_string();
        roles.push(Role {
            name: task_name.clone(),
            spec_path: strings(&["spec", "tasks", &index, "template", "spec"]),
            spec_field: format!("{field}.template.spec"),
            pods: (0..replicas)
                .map(|r| format!("{name}-{task_name}-{r}"))
                .collect(),
        });
    }
    let gang = match count(value, &["spec", "minAvailable"], "spec.minAvailable", 0)? {
        0 => Gang {
            min_count: task_min,
            by: "Volcano's gang: every task's minAvailable (its replicas by default)".into(),
        },
        n => Gang {
            min_count: n,
            by: "spec.minAvailable".into(),
        },
    };
    Ok(Expansion {
        kind: "Job",
        roles,
        gang: (gang.min_count > 0).then_some(gang),
        notes: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fixed(_: &str) -> String {
        "xxxxx".into()
    }

    fn pods(e: &Expansion) -> Vec<(&str, Vec<&str>)> {
        e.roles
            .iter()
            .map(|r| (r.name.as_str(), r.pods.iter().map(String::as_str).collect()))
            .collect()
    }

    #[test]
    fn a_jobset_makes_replicas_times_parallel_pods_named_as_the_job_controller_names_them() {
        let js = json!({"spec": {"replicatedJobs": [
            {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2, "completions": 2, "template": {"spec": {}}}}},
            {"name": "driver", "template": {"spec": {"template": {"spec": {}}}}},
        ]}});
        let e = expand("JobSet", "jobset.x-k8s.io/v1alpha2", &js, "train", &fixed).expect("ok");
        assert_eq!(
            pods(&e),
            vec![
                (
                    "workers",
                    vec![
                        "train-workers-0-0-xxxxx",
                        "train-workers-0-1-xxxxx",
                        "train-workers-1-0-xxxxx",
                        "train-workers-1-1-xxxxx"
                    ]
                ),
                ("driver", vec!["train-driver-0-0-xxxxx"]),
            ]
        );
        assert_eq!(
            e.roles[0].spec_field,
            "spec.replicatedJobs[0].template.spec.template.spec"
        );
        assert!(at(&js, &e.roles[1].spec_path).is_some());
    }

    #[test]
    fn a_leader_worker_set_makes_groups_of_size_pods_and_leaders_use_the_worker_template_by_default()
     {
        let lws = json!({"spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 3, "workerTemplate": {"spec": {}}}}});
        let e = expand(
            "LeaderWorkerSet",
            "leaderworkerset.x-k8s.io/v1",
            &lws,
            "vllm",
            &fixed,
        )
        .expect("ok");
        assert_eq!(
            pods(&e),
            vec![
                ("leader", vec!["vllm-0", "vllm-1"]),
                (
                    "worker",
                    vec!["vllm-0-1", "vllm-0-2", "vllm-1-1", "vllm-1-2"]
                ),
            ]
        );
        assert_eq!(
            e.roles[0].spec_field,
            "spec.leaderWorkerTemplate.workerTemplate.spec"
        );
    }

    #[test]
    fn mpi_jobs_count_the_launcher_in_both_versions_and_their_gang() {
        let job = json!({"spec": {
            "runPolicy": {"schedulingPolicy": {}},
            "mpiReplicaSpecs": {"Worker": {"replicas": 2, "template": {}}, "Launcher": {"template": {}}},
        }});
        let v2 = expand("MPIJob", "kubeflow.org/v2beta1", &job, "pi", &fixed).expect("ok");
        assert_eq!(
            pods(&v2),
            vec![
                ("launcher", vec!["pi-launcher-xxxxx"]),
                ("worker", vec!["pi-worker-0", "pi-worker-1"]),
            ]
        );
        assert_eq!(v2.gang.as_ref().map(|g| g.min_count), Some(3));
        let v1 = expand("MPIJob", "kubeflow.org/v1", &job, "pi", &fixed).expect("ok");
        assert_eq!(v1.roles[0].pods, vec!["pi-launcher"]);
        assert_eq!(v1.gang.as_ref().map(|g| g.min_count), Some(3));
        let bad =
            expand("MPIJob", "kubeflow.org/v1alpha2", &job, "pi", &fixed).expect_err("version");
        assert_eq!(bad.field, "apiVersion");
    }

    #[test]
    fn a_pytorch_job_names_master_and_workers_and_a_suspended_one_without_a_queue_makes_none() {
        let job = json!({"spec": {"pytorchReplicaSpecs": {
            "Worker": {"replicas": 2, "template": {}}, "Master": {"replicas": 1, "template": {}}}}});
        let e = expand("PyTorchJob", "kubeflow.org/v1", &job, "bert", &fixed).expect("ok");
        assert_eq!(
            pods(&e),
            vec![
                ("master", vec!["bert-master-0"]),
                ("worker", vec!["bert-worker-0", "bert-worker-1"]),
            ]
        );
        assert_eq!(e.gang, None);
        let mut suspended = job.clone();
        suspended["spec"]["runPolicy"] = json!({"suspend": true});
        let e = expand("PyTorchJob", "kubeflow.org/v1", &suspended, "bert", &fixed).expect("ok");
        assert!(e.roles.iter().all(|r| r.pods.is_empty()), "{e:?}");
        suspended["metadata"] = json!({"labels": {KUEUE_QUEUE_LABEL: "team-a"}});
        let e = expand("PyTorchJob", "kubeflow.org/v1", &suspended, "bert", &fixed).expect("ok");
        assert_eq!(e.roles[1].pods.len(), 2);
        assert!(e.notes[0].contains("read as admitted"), "{:?}", e.notes);
    }

    #[test]
    fn a_volcano_job_is_a_gang_of_its_tasks_min_available() {
        let job = json!({"spec": {"tasks": [
            {"name": "ps", "replicas": 1, "template": {}},
            {"replicas": 2, "minAvailable": 1, "template": {}},
        ]}});
        let e = expand("Job", "batch.volcano.sh/v1alpha1", &job, "tf", &fixed).expect("ok");
        assert_eq!(
            pods(&e),
            vec![
                ("ps", vec!["tf-ps-0"]),
                ("default1", vec!["tf-default1-0", "tf-default1-1"]),
            ]
        );
        assert_eq!(e.gang.as_ref().map(|g| g.min_count), Some(2));
        assert!(handles("Job", "batch.volcano.sh/v1alpha1"));
        assert!(!handles("Job", "batch/v1"));
    }

    #[test]
    fn bad_fields_are_named() {
        let e = expand(
            "JobSet",
            "jobset.x-k8s.io/v1alpha2",
            &json!({"spec": {}}),
            "x",
            &fixed,
        )
        .expect_err("no jobs");
        assert_eq!(e.field, "spec.replicatedJobs");
        let e = expand(
            "PyTorchJob",
            "kubeflow.org/v1",
            &json!({"spec": {"pytorchReplicaSpecs": {"Boss": {}}}}),
            "x",
            &fixed,
        )
        .expect_err("bad role");
        assert_eq!(e.field, "spec.pytorchReplicaSpecs.Boss");
        let e = expand(
            "LeaderWorkerSet",
            "leaderworkerset.x-k8s.io/v1",
            &json!({"spec": {"leaderWorkerTemplate": {"size": "2", "workerTemplate": {}}}}),
            "x",
            &fixed,
        )
        .expect_err("size");
        assert_eq!(e.field, "spec.leaderWorkerTemplate.size");
    }
}
