//! `gpu-dra match -f --replicas` on the workloads users apply beside a GPU driver, as their
//! controllers make pods: JobSet, LeaderWorkerSet, MPIJob (v2beta1 and v1), PyTorchJob,
//! Volcano's Job, Kueue-queued Jobs, and `scheduling.k8s.io` PodGroups with claims the group
//! shares. The manifests are the projects' published examples with GPUs asked the way their
//! users ask (`nvidia.com/gpu` limits, which the stock `gpu.nvidia.com` class backs, or a
//! ResourceClaimTemplate). Each test asserts the verdict per workload (all at once, N of M, or
//! none for a gang short of its minimum) and where the pods' devices went.
#![cfg(feature = "tools")]
mod common;
use common::{gpu_dra, repo, text};
use std::process::Output;

use serde_json::Value;

/// `match -f FILE --replicas -o json` on a fleet of nodes (`NAME=SPEC`), stock classes.
fn place(manifest: &str, nodes: &[(&str, &str)]) -> (Output, String) {
    on_fleet("match", manifest, nodes)
}

/// `COMMAND -f FILE --replicas -o json` on a fleet of nodes (`NAME=SPEC`), stock classes.
fn on_fleet(command: &str, manifest: &str, nodes: &[(&str, &str)]) -> (Output, String) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("workload.yaml");
    std::fs::write(&path, manifest).expect("write");
    let mut args = vec![command.to_string()];
    for (node, spec) in nodes {
        args.push("--slices".into());
        args.push(format!("{node}={spec}"));
    }
    let classes = repo("deviceclasses");
    let file = path.display().to_string();
    args.extend(
        [
            "--classes",
            &classes,
            "-f",
            &file,
            "--replicas",
            "-o",
            "json",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let out = gpu_dra(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = text(&out.stderr).to_string();
    (out, stderr)
}

/// Claim name → the nodes (pools) of its allocated devices.
fn pools_of(out: &Output) -> Vec<(String, String)> {
    let value: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let items = match value.get("items") {
        Some(Value::Array(items)) => items.clone(),
        _ if value.is_object() => vec![value],
        _ => vec![],
    };
    let mut out = Vec::new();
    for claim in items {
        let name = claim["metadata"]["name"].as_str().unwrap_or("").to_string();
        for result in claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
        {
            out.push((
                name.clone(),
                result["pool"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    out
}

const TWO_H100_NODES: [(&str, &str); 2] = [
    ("gpu-a", "sim:8xH100-SXM5-80GB"),
    ("gpu-b", "sim:8xH100-SXM5-80GB"),
];

/// JobSet's published `paralleljobs` example with 4-GPU workers: each replicated job makes
/// `replicas` Jobs of `parallelism` pods; the device-less driver is a pod of the set too.
#[test]
fn a_jobset_places_every_pod_of_its_replicated_jobs() {
    let jobset = r#"
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: paralleljobs
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 2
        completions: 2
        backoffLimit: 0
        template:
          spec:
            containers:
            - name: train
              image: nvcr.io/nvidia/pytorch:24.05-py3
              resources:
                limits:
                  nvidia.com/gpu: 4
  - name: driver
    template:
      spec:
        parallelism: 1
        completions: 1
        backoffLimit: 0
        template:
          spec:
            containers:
            - name: sleep
              image: busybox
              command: [sleep, 100s]
"#;
    let (out, stderr) = place(jobset, &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("note: JobSet default/paralleljobs: all 5 pods placed"),
        "{stderr}"
    );
    let pools = pools_of(&out);
    assert!(
        pools
            .iter()
            .any(|(claim, _)| claim.starts_with("paralleljobs-workers-1-1-")),
        "pods are named as the Job controller names an Indexed Job's: {pools:?}"
    );
    assert_eq!(pools.len(), 16, "four pods of four GPUs: {pools:?}");
    assert_eq!(pools.iter().filter(|(_, p)| p == "gpu-a").count(), 8);

    // One node: the second Job's pods wait.
    let (out, stderr) = place(jobset, &TWO_H100_NODES[..1]);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("note: JobSet default/paralleljobs: 3 of 5 pods placed, 2 would wait"),
        "{stderr}"
    );
}

/// LWS's published vLLM multi-node example: groups of a leader and workers of 8 GPUs each.
#[test]
fn a_leader_worker_set_places_leaders_then_workers_and_reports_the_groups_that_wait() {
    let lws = r#"
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: vllm
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 2
    restartPolicy: RecreateGroupOnPodRestart
    leaderTemplate:
      metadata:
        labels:
          role: leader
      spec:
        containers:
          - name: vllm-leader
            image: vllm/vllm-openai:latest
            resources:
              limits:
                nvidia.com/gpu: "8"
    workerTemplate:
      spec:
        containers:
          - name: vllm-worker
            image: vllm/vllm-openai:latest
            resources:
              limits:
                nvidia.com/gpu: "8"
"#;
    let (out, stderr) = place(lws, &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let pools = pools_of(&out);
    assert!(
        pools
            .iter()
            .any(|(c, p)| c.starts_with("vllm-1-extended-") && p == "gpu-b"),
        "leaders first, one per node: {pools:?}"
    );
    assert!(
        stderr
            .contains("Pod default/vllm-0-1 (LeaderWorkerSet default/vllm-worker, replica 1 of 2)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("note: LeaderWorkerSet default/vllm: 2 of 4 pods placed, 2 would wait"),
        "{stderr}"
    );
}

/// The training operator's published PyTorchJob (`pytorch-simple`) and MPIJob v1: master and
/// workers named `<job>-<type>-<i>`; the v1 MPIJob's launcher is the pod `<job>-launcher`.
#[test]
fn training_operator_jobs_name_their_pods_and_count_the_launcher() {
    let pytorch = r#"
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: pytorch-simple
  namespace: kubeflow
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
            - name: pytorch
              image: docker.io/kubeflowkatib/pytorch-mnist:v1beta1-45c5727
              resources:
                limits:
                  nvidia.com/gpu: 1
    Worker:
      replicas: 3
      restartPolicy: OnFailure
      template:
        spec:
          containers:
            - name: pytorch
              image: docker.io/kubeflowkatib/pytorch-mnist:v1beta1-45c5727
              resources:
                limits:
                  nvidia.com/gpu: 1
"#;
    let (out, stderr) = place(pytorch, &TWO_H100_NODES[..1]);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let pools = pools_of(&out);
    for pod in ["pytorch-simple-master-0-", "pytorch-simple-worker-2-"] {
        assert!(pools.iter().any(|(c, _)| c.starts_with(pod)), "{pools:?}");
    }
    assert!(
        stderr.contains("note: PyTorchJob kubeflow/pytorch-simple: all 4 pods placed"),
        "{stderr}"
    );

    let mpi = r#"
apiVersion: kubeflow.org/v1
kind: MPIJob
metadata:
  name: tensorflow-mnist
spec:
  slotsPerWorker: 1
  runPolicy:
    cleanPodPolicy: Running
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec:
          containers:
          - image: docker.io/kubeflow/mpi-horovod-mnist
            name: mpi-launcher
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - image: docker.io/kubeflow/mpi-horovod-mnist
            name: mpi-worker
            resources:
              limits:
                nvidia.com/gpu: 8
"#;
    let (out, stderr) = place(mpi, &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("note: MPIJob default/tensorflow-mnist: all 3 pods placed"),
        "{stderr}"
    );
    assert_eq!(pools_of(&out).len(), 16);
}

/// Volcano's Job binds as one gang: short of `minAvailable`, none of its pods binds and the
/// devices its first pods would have taken stay free for the next workload.
#[test]
fn a_volcano_gang_that_does_not_fit_leaves_its_devices_to_the_next_workload() {
    let jobs = r#"
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: mpi-gang
spec:
  minAvailable: 3
  schedulerName: volcano
  plugins:
    ssh: []
    svc: []
  tasks:
    - replicas: 3
      name: worker
      template:
        spec:
          containers:
            - image: volcanosh/example-mpi:0.0.3
              name: mpiworker
              resources:
                limits:
                  nvidia.com/gpu: 8
          restartPolicy: OnFailure
---
apiVersion: batch/v1
kind: Job
metadata:
  name: after
spec:
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: busybox
        resources:
          limits:
            nvidia.com/gpu: 8
"#;
    let (out, stderr) = place(jobs, &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("note: Job default/mpi-gang: none of its 3 pods binds: a gang of at least 3 (spec.minAvailable) and only 2 fit"),
        "{stderr}"
    );
    assert!(
        stderr.contains("note: Job default/after: all 2 pods placed"),
        "{stderr}"
    );
    let pools = pools_of(&out);
    assert_eq!(
        pools.len(),
        16,
        "only the batch Job's claims are allocated: {pools:?}"
    );
    assert!(
        pools.iter().all(|(claim, _)| claim.starts_with("after-")),
        "{pools:?}"
    );
}

/// Kueue's published sample Job (suspended, queued by label) is read as admitted; a suspended
/// Job no queue admits runs no pods.
#[test]
fn a_kueue_queued_job_is_read_as_admitted_and_a_plainly_suspended_one_runs_nothing() {
    let job = |name: &str, labels: &str| {
        format!(
            r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: default
{labels}spec:
  parallelism: 3
  completions: 3
  suspend: true
  template:
    spec:
      containers:
      - name: dummy-job
        image: registry.k8s.io/e2e-test-images/agnhost:2.53
        args: ["entrypoint-tester", "hello", "world"]
        resources:
          requests:
            cpu: 1
            memory: "200Mi"
          limits:
            nvidia.com/gpu: 2
      restartPolicy: Never
"#
        )
    };
    let queued = job(
        "sample-job",
        "  labels:\n    kueue.x-k8s.io/queue-name: user-queue\n",
    );
    let (out, stderr) = place(&queued, &TWO_H100_NODES[..1]);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("Kueue queues it (LocalQueue \"user-queue\"): read as admitted"),
        "{stderr}"
    );
    assert_eq!(pools_of(&out).len(), 6);
    let plain = job("held", "");
    let (out, stderr) = place(&plain, &TWO_H100_NODES[..1]);
    assert!(
        stderr.contains("the Job controller makes no pods"),
        "{stderr}"
    );
    assert!(pools_of(&out).is_empty(), "{stderr}");
}

/// A `scheduling.k8s.io` PodGroup with a gang policy and a claim its pods share: one claim for
/// the group, allocated once, and every pod on the node of its devices.
#[test]
fn a_pod_group_shares_its_claim_and_binds_as_a_gang() {
    let group = |min_count: u32, pods: u32, own: u32| {
        let mut text = format!(
            r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: shared-gpu}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {{deviceClassName: gpu.nvidia.com}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: own-gpus}}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: gpu.nvidia.com, count: {own}}}
---
apiVersion: scheduling.k8s.io/v1beta1
kind: PodGroup
metadata: {{name: trainers}}
spec:
  schedulingPolicy:
    gang: {{minCount: {min_count}}}
  resourceClaims:
  - name: shared
    resourceClaimTemplateName: shared-gpu
"#
        );
        for i in 0..pods {
            text.push_str(&format!(
                r#"---
apiVersion: v1
kind: Pod
metadata: {{name: trainer-{i}}}
spec:
  schedulingGroup: {{podGroupName: trainers}}
  containers:
  - name: c
    image: busybox
    resources: {{claims: [{{name: shared}}, {{name: own}}]}}
  resourceClaims:
  - name: shared
    resourceClaimTemplateName: shared-gpu
  - name: own
    resourceClaimTemplateName: own-gpus
"#
            ));
        }
        text
    };
    // One shared GPU and three of each pod's own: seven GPUs of one node.
    let (out, stderr) = place(&group(2, 2, 3), &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("note: PodGroup default/trainers: all 2 pods placed"),
        "{stderr}"
    );
    let pools = pools_of(&out);
    let shared: Vec<_> = pools
        .iter()
        .filter(|(c, _)| c.starts_with("trainers-shared-"))
        .collect();
    assert_eq!(shared.len(), 1, "one claim for the group: {pools:?}");
    assert_eq!(pools.len(), 7, "{pools:?}");
    assert!(
        pools.iter().all(|(_, p)| p == "gpu-a"),
        "the shared claim holds both pods to its node: {pools:?}"
    );

    // Four of each: the second pod cannot join the first on gpu-a, so the gang of two binds
    // nothing; with a gang of one, the first pod starts alone.
    let (out, stderr) = place(&group(2, 2, 4), &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("a claim of the pod is allocated on node gpu-a"),
        "{stderr}"
    );
    assert!(
        stderr.contains("note: PodGroup default/trainers: none of its 2 pods binds: a gang of at least 2 (PodGroup default/trainers: spec.schedulingPolicy.gang.minCount) and only 1 fit"),
        "{stderr}"
    );
    let (out, stderr) = place(&group(1, 2, 4), &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr
            .contains("note: PodGroup default/trainers: 1 of 2 pods placed, at least 1 as a gang"),
        "{stderr}"
    );
    assert_eq!(pools_of(&out).len(), 5);
}

/// A pod asking an extended resource no DeviceClass backs and no node's device plugin serves
/// stays Pending as the scheduler leaves it: Insufficient.
#[test]
fn an_extended_resource_nothing_serves_leaves_the_pod_pending() {
    let pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: mig-user}
spec:
  containers:
  - name: cuda
    image: nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04
    resources:
      limits:
        nvidia.com/mig-1g.10gb: 1
"#;
    let (out, stderr) = place(pod, &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("0/2 nodes are available: 2 Insufficient nvidia.com/mig-1g.10gb"),
        "{stderr}"
    );
}

/// `capacity --replicas` of a workload of several pods counts copies of the whole workload on
/// the fleet: each copy's pods placed in turn, all of them (or a gang's minimum) or the copy
/// does not count; the next copy's first pod that does not fit says why.
#[test]
fn capacity_counts_copies_of_a_whole_workload() {
    let jobset = r#"
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: train}
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        template:
          spec:
            containers:
            - {name: t, image: x, resources: {limits: {nvidia.com/gpu: 4}}}
  - name: driver
    template:
      spec:
        template:
          spec:
            containers: [{name: d, image: x}]
"#;
    let (out, stderr) = on_fleet("capacity", jobset, &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let answer: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(answer["workload"], "JobSet default/train");
    assert_eq!(answer["pods"], 3);
    assert_eq!(
        answer["fits"], 2,
        "8 GPUs a copy, 16 in the fleet: {answer}"
    );
    assert!(
        answer["stops"]
            .as_str()
            .is_some_and(|s| s.contains("train-workers") && s.contains("devices in use")),
        "{answer}"
    );
}

/// Kueue's quota on gpu-dra's devices: with the Configuration's deviceClassMappings, a
/// ClusterQueue's nominal quota of whole GPUs admits the first queued Job and leaves the second
/// suspended (its pods never run), saying which ClusterQueue and resource stop it; a claim with
/// a CEL selector is inadmissible, as Kueue marks it.
#[test]
fn kueue_quota_on_devices_admits_in_order_and_names_what_holds_a_workload() {
    let kueue = r#"
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
resources:
  deviceClassMappings:
  - name: whole-gpus
    deviceClassNames: [gpu.nvidia.com]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: gpus}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, whole-gpus]
    flavors:
    - name: default
      resources:
      - {name: cpu, nominalQuota: 64}
      - {name: whole-gpus, nominalQuota: 6}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team, namespace: default}
spec: {clusterQueue: gpus}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-gpus}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com, count: 2}
"#;
    let job = |name: &str, template: &str| {
        format!(
            r#"---
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  labels: {{kueue.x-k8s.io/queue-name: team}}
spec:
  parallelism: 2
  completions: 2
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: x
        resources: {{requests: {{cpu: "1"}}, claims: [{{name: gpu}}]}}
      resourceClaims:
      - {{name: gpu, resourceClaimTemplateName: {template}}}
"#
        )
    };
    let manifest = format!(
        "{kueue}{}{}",
        job("first", "two-gpus"),
        job("second", "two-gpus")
    );
    let (out, stderr) = place(&manifest, &TWO_H100_NODES);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("Job default/second: Kueue would not admit it (quota: ClusterQueue gpus: whole-gpus needs 4, 2 of 6 left)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("note: Job default/first: all 2 pods placed"),
        "{stderr}"
    );
    assert_eq!(pools_of(&out).len(), 4, "only the first Job's GPUs");

    let selector = kueue.replace(
        "exactly: {deviceClassName: gpu.nvidia.com, count: 2}",
        "exactly: {deviceClassName: gpu.nvidia.com, count: 2, selectors: [{cel: {expression: 'true'}}]}",
    );
    let (out, stderr) = place(
        &format!("{selector}{}", job("first", "two-gpus")),
        &TWO_H100_NODES,
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "inadmissible: claim \"gpu\" request \"gpu\": Kueue does not admit CEL selectors"
        ),
        "{stderr}"
    );

    let cohort = kueue.replace(
        "  namespaceSelector: {}",
        "  cohortName: shared\n  namespaceSelector: {}",
    );
    let (out, stderr) = place(
        &format!("{cohort}{}", job("first", "two-gpus")),
        &TWO_H100_NODES,
    );
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("spec.cohortName") && stderr.contains("not predicted"),
        "{stderr}"
    );
}
