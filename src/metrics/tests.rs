use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::{MeasuredDriver, Metrics, MetricsServer, ObserverList};
use crate::gpu::sim::SimNode;
use crate::plugin::KubeletRegistration;
use crate::prepare::ClaimRef;
use crate::prepare::checkpoint::Checkpoint;
use crate::prepare::driver::DriverObserver;
use crate::slices::publish::{PublishError, SyncReport};

fn claim() -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: "c".into(),
        uid: "u".into(),
    }
}

/// The value of the sample line that starts with `series` (name plus labels), if any.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Asserts that every series has its value in the exposition.
fn assert_samples(text: &str, expected: &[(&str, f64)]) {
    for (series, value) in expected {
        assert_eq!(sample(text, series), Some(*value), "{series} in\n{text}");
    }
}

/// NVIDIA's kubelet plugin's series (`pkg/metrics`), by its names and labels: request series
/// exist from the start at zero; a call's claims are in flight until each is done; successes
/// are counted and timed in NVIDIA's buckets, failures counted by error type; prepared devices
/// by NVIDIA's device types.
#[test]
fn nvidias_series_are_exported_under_its_names() {
    use crate::prepare::driver::Operation;
    let metrics = Metrics::for_node("gpu.nvidia.com", "node-1");
    let text = metrics.encode().expect("encodes");
    assert_samples(
        &text,
        &[
            (
                r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"}"#,
                0.0,
            ),
            (
                r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="unprepare"}"#,
                0.0,
            ),
            (
                r#"nvidia_dra_request_duration_seconds_count{driver="gpu.nvidia.com",operation="prepare"}"#,
                0.0,
            ),
            (
                r#"nvidia_dra_requests_inflight{driver="gpu.nvidia.com",operation="prepare"}"#,
                0.0,
            ),
        ],
    );
    metrics.starting(Operation::Prepare, 3);
    let text = metrics.encode().expect("encodes");
    assert_samples(
        &text,
        &[(
            r#"nvidia_dra_requests_inflight{driver="gpu.nvidia.com",operation="prepare"}"#,
            3.0,
        )],
    );
    metrics.prepared(&claim(), true, 0.07);
    metrics.prepared(&claim(), true, 3.0);
    metrics.prepared(&claim(), false, 0.2);
    metrics.starting(Operation::Unprepare, 1);
    metrics.unprepared(&claim(), false, 0.01);
    let text = metrics.encode().expect("encodes");
    assert_samples(
        &text,
        &[
            (
                r#"nvidia_dra_requests_inflight{driver="gpu.nvidia.com",operation="prepare"}"#,
                0.0,
            ),
            (
                r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"}"#,
                2.0,
            ),
            // 50 ms doubling: 70 ms in le=0.1, 3 s in le=3.2.
            (
                r#"nvidia_dra_request_duration_seconds_bucket{driver="gpu.nvidia.com",operation="prepare",le="0.1"}"#,
                1.0,
            ),
            (
                r#"nvidia_dra_request_duration_seconds_bucket{driver="gpu.nvidia.com",operation="prepare",le="3.2"}"#,
                2.0,
            ),
            (
                r#"nvidia_dra_node_prepare_errors_total{driver="gpu.nvidia.com",error_type="prepare_devices"}"#,
                1.0,
            ),
            (
                r#"nvidia_dra_node_unprepare_errors_total{driver="gpu.nvidia.com",error_type="unprepare_devices"}"#,
                1.0,
            ),
            (
                r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="unprepare"}"#,
                0.0,
            ),
        ],
    );
    assert!(
        text.contains("# TYPE nvidia_dra_request_duration_seconds histogram"),
        "{text}"
    );
}

#[test]
fn prepare_and_unprepare_are_counted_by_result_with_latency_buckets() {
    let metrics = Metrics::new();
    metrics.prepared(&claim(), true, 0.003);
    metrics.prepared(&claim(), true, 0.5);
    metrics.prepared(&claim(), false, 2.0);
    metrics.unprepared(&claim(), true, 0.001);
    let text = metrics.encode().expect("encodes");
    assert_samples(
        &text,
        &[
            (r#"gpu_dra_prepare_requests_total{result="ok"}"#, 2.0),
            (r#"gpu_dra_prepare_requests_total{result="error"}"#, 1.0),
            ("gpu_dra_prepare_errors_total", 1.0),
            (r#"gpu_dra_unprepare_requests_total{result="ok"}"#, 1.0),
            ("gpu_dra_unprepare_errors_total", 0.0),
            ("gpu_dra_prepare_duration_seconds_count", 3.0),
            ("gpu_dra_prepare_duration_seconds_sum", 2.503),
            // Cumulative buckets: 3 ms falls in le=0.004, 0.5 s in le=0.512, 2 s in le=2.048.
            (
                r#"gpu_dra_prepare_duration_seconds_bucket{le="0.004"}"#,
                1.0,
            ),
            (
                r#"gpu_dra_prepare_duration_seconds_bucket{le="0.512"}"#,
                2.0,
            ),
            (r#"gpu_dra_prepare_duration_seconds_bucket{le="+Inf"}"#, 3.0),
        ],
    );
    assert!(text.contains("# TYPE gpu_dra_prepare_duration_seconds histogram"));
}

#[test]
fn gauges_follow_the_checkpoint_and_the_mig_inventory() {
    let metrics = Metrics::new();
    let mut checkpoint = Checkpoint::new("boot");
    for (uid, state, devices) in [
        ("a", "PrepareCompleted", 2),
        ("b", "PrepareCompleted", 1),
        // Being prepared: not counted until complete.
        ("c", "PrepareStarted", 4),
    ] {
        let devices: Vec<_> = (0..devices)
            .map(|i| serde_json::json!({"requestNames": ["gpu"], "pool": "n1", "device": format!("gpu-{i}")}))
            .collect();
        let entry = serde_json::json!({
            "namespace": "default", "name": uid, "uid": uid, "state": state, "devices": devices,
        });
        checkpoint.claims.insert(
            uid.into(),
            serde_json::from_value(entry).expect("claim entry"),
        );
    }
    metrics.observe_checkpoint(&checkpoint);
    // NVIDIA's series: the completed claims' devices by its device types.
    let text = metrics.encode().expect("encodes");
    for (device_type, count) in [("gpu", 3.0), ("mig", 0.0), ("vfio", 0.0), ("unknown", 0.0)] {
        let series = format!(
            r#"nvidia_dra_prepared_devices{{node="",driver="gpu.nvidia.com",device_type="{device_type}"}}"#
        );
        assert_eq!(sample(&text, &series), Some(count), "{series} in\n{text}");
    }

    let sim = SimNode::new("2xH100-SXM5-80GB".parse().expect("spec"), "n1", None);
    sim.set_mig_mode(1, true).expect("MIG mode on");
    let inventory = sim.inventory().expect("inventory");
    let profile = &inventory.gpus[1]
        .mig
        .as_ref()
        .expect("MIG-capable")
        .profiles[0];
    let gi = sim
        .create_gpu_instance(1, profile.id, profile.placements[0])
        .expect("GPU instance");
    sim.create_compute_instance(1, gi)
        .expect("compute instance");
    metrics.observe_inventory(&sim.inventory().expect("inventory"));

    assert_samples(
        &metrics.encode().expect("encodes"),
        &[
            ("gpu_dra_prepared_claims", 2.0),
            ("gpu_dra_prepared_devices", 3.0),
            ("gpu_dra_mig_instances", 1.0),
        ],
    );
}

#[test]
fn slice_syncs_count_writes_and_errors_and_set_published_devices() {
    let metrics = Metrics::new();
    assert!(!metrics.readiness().slices_synced);
    let failed: Result<SyncReport, PublishError> = Err(PublishError::List {
        node: "n1".into(),
        reason: "connection refused".into(),
    });
    metrics.observe_slice_sync(&failed, 8);
    assert!(
        !metrics.readiness().slices_synced,
        "a failed sync publishes nothing"
    );
    let report = SyncReport {
        created: 2,
        updated: 1,
        deleted: 0,
        generation: 1,
    };
    metrics.observe_slice_sync(&Ok(report), 8);
    assert_samples(
        &metrics.encode().expect("encodes"),
        &[
            ("gpu_dra_slice_sync_errors_total", 1.0),
            (
                r#"gpu_dra_slice_sync_writes_total{operation="create"}"#,
                2.0,
            ),
            (
                r#"gpu_dra_slice_sync_writes_total{operation="update"}"#,
                1.0,
            ),
            ("gpu_dra_published_devices", 8.0),
        ],
    );
    assert!(metrics.readiness().slices_synced);
}

#[test]
fn observer_list_forwards_to_every_observer() {
    let first = Arc::new(Metrics::new());
    let second = Arc::new(Metrics::new());
    let list = ObserverList(vec![first.clone(), second.clone()]);
    list.prepared(&claim(), true, 0.01);
    list.unprepared(&claim(), false, 0.01);
    for metrics in [first, second] {
        let text = metrics.encode().expect("encodes");
        assert_eq!(
            sample(&text, r#"gpu_dra_prepare_requests_total{result="ok"}"#),
            Some(1.0)
        );
        assert_eq!(sample(&text, "gpu_dra_unprepare_errors_total"), Some(1.0));
    }
}

/// One HTTP/1.1 GET; returns the status code and body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Whether `path` answers `status` within a second (the registration follower runs async).
async fn eventually(addr: std::net::SocketAddr, path: &str, status: u16) -> bool {
    for _ in 0..50 {
        if get(addr, path).await.0 == status {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn server_serves_metrics_and_probes_until_shutdown() {
    let metrics = Arc::new(Metrics::new());
    let server = MetricsServer::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = server.local_addr();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let serving = tokio::spawn(server.serve(metrics.clone(), shutdown_rx.clone()));
    let (registration, registration_rx) = watch::channel(KubeletRegistration::Pending);
    let follower = metrics
        .clone()
        .follow_registration(registration_rx, shutdown_rx);

    assert_eq!(get(addr, "/healthz").await.0, 200);
    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("not registered with kubelet"), "{body}");
    assert!(body.contains("ResourceSlices not published yet"), "{body}");

    registration.send_replace(KubeletRegistration::Registered);
    metrics.observe_slice_sync(&Ok(SyncReport::default()), 8);
    assert!(
        eventually(addr, "/readyz", 200).await,
        "ready once registered and synced"
    );

    metrics.prepared(&claim(), true, 0.02);
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        sample(&body, r#"gpu_dra_prepare_requests_total{result="ok"}"#),
        Some(1.0)
    );
    assert_eq!(get(addr, "/nope").await.0, 404);

    // A rejected re-registration makes the node unready again.
    registration.send_replace(KubeletRegistration::Rejected {
        error: "version".into(),
    });
    assert!(eventually(addr, "/readyz", 503).await);

    shutdown.send_replace(true);
    serving.await.expect("joins").expect("clean shutdown");
    follower.await.expect("joins");
    assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
}

#[tokio::test]
async fn binding_a_taken_port_fails_with_the_address() {
    let first = MetricsServer::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let Err(error) = MetricsServer::bind(first.local_addr()).await else {
        panic!("second bind succeeded");
    };
    assert!(
        error.to_string().contains(&first.local_addr().to_string()),
        "{error}"
    );
}

#[test]
fn device_health_and_gpu_faults_are_exposed() {
    use crate::gpu::events::{GpuEvent, GpuEventKind};
    use crate::plugin::{DeviceHealth, DeviceHealthStatus};
    let metrics = Metrics::new();
    let health = |name: &str, status| DeviceHealth {
        pool_name: "n1".into(),
        device_name: name.into(),
        status,
        message: String::new(),
        last_updated: std::time::SystemTime::now(),
        health_check_timeout: None,
    };
    metrics.observe_device_health(&[
        health("gpu-0", DeviceHealthStatus::Unhealthy),
        health("gpu-1", DeviceHealthStatus::Healthy),
    ]);
    let event = |kind| GpuEvent {
        minor: 0,
        kind,
        gpu_instance_id: None,
        compute_instance_id: None,
    };
    metrics.observe_gpu_event(&event(GpuEventKind::Xid { code: 79 }));
    metrics.observe_gpu_event(&event(GpuEventKind::Xid { code: 79 }));
    metrics.observe_gpu_event(&event(GpuEventKind::DoubleBitEcc));
    let text = metrics.encode().expect("encode");
    assert_samples(
        &text,
        &[
            (
                r#"gpu_dra_device_health{device="gpu-0",state="unhealthy"}"#,
                1.0,
            ),
            (
                r#"gpu_dra_device_health{device="gpu-0",state="healthy"}"#,
                0.0,
            ),
            (
                r#"gpu_dra_device_health{device="gpu-1",state="healthy"}"#,
                1.0,
            ),
            (r#"gpu_dra_gpu_xid_errors_total{gpu="0",xid="79"}"#, 2.0),
            (r#"gpu_dra_gpu_ecc_double_bit_errors_total{gpu="0"}"#, 1.0),
        ],
    );
    // A device no longer reported is no longer exposed.
    metrics.observe_device_health(&[health("gpu-1", DeviceHealthStatus::Healthy)]);
    let text = metrics.encode().expect("encode");
    assert_eq!(
        sample(
            &text,
            r#"gpu_dra_device_health{device="gpu-0",state="unhealthy"}"#
        ),
        None
    );
}

#[test]
fn a_standby_instance_is_ready_while_the_instance_it_replaces_publishes() {
    let metrics = Metrics::new();
    metrics.observe_registration(&KubeletRegistration::Registered);
    assert!(!metrics.readiness().is_ready(), "nothing published yet");
    assert_eq!(
        metrics.readiness().missing(),
        ["ResourceSlices not published yet"]
    );
    // A seamless upgrade's new pod: the old one holds the publisher lock and keeps the slices
    // current, so the rollout may proceed.
    metrics.set_publisher_standby(true);
    assert!(metrics.readiness().is_ready());
    // It took over: ready again only once its own first sync is done.
    metrics.set_publisher_standby(false);
    assert!(!metrics.readiness().is_ready());
}

/// Each prepared device is one info series with the labels DCGM exporter joins on; a claim
/// still being prepared has none, and an unprepared claim's series go.
#[test]
fn prepared_devices_are_info_series_that_join_with_dcgm() {
    let sim = SimNode::new("2xH100-SXM5-80GB".parse().expect("spec"), "n1", None);
    sim.set_mig_mode(1, true).expect("MIG mode on");
    let before = sim.inventory().expect("inventory");
    let profile = before.gpus[1].mig.as_ref().expect("MIG").profiles[0].clone();
    let gi = sim
        .create_gpu_instance(1, profile.id, profile.placements[0])
        .expect("GPU instance");
    let (ci, mig_uuid) = sim
        .create_compute_instance(1, gi)
        .expect("compute instance");
    let inventory = sim.inventory().expect("inventory");
    let gpu0 = inventory.gpus[0].uuid.clone();
    let gpu1 = inventory.gpus[1].uuid.clone();
    let mps = serde_json::to_value(
        crate::config::decode(&serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}))
            .expect("config"),
    )
    .expect("as the checkpoint stores it");
    let entries = [
        serde_json::json!({"namespace": "ml", "name": "whole", "uid": "u1", "state": "PrepareCompleted",
            "devices": [{"requestNames": ["gpu"], "pool": "n1", "device": "gpu-0", "uuid": gpu0,
                "shareId": "s1", "consumed": {"memory": "20Gi"}, "config": mps}]}),
        serde_json::json!({"namespace": "ml", "name": "mig", "uid": "u2", "state": "PrepareCompleted",
            "devices": [{"requestNames": ["mig"], "pool": "n1", "device": format!("gpu-1-mig-{}-{}-0", profile.name.replace('.', ""), profile.id),
                "uuid": mig_uuid,
                "mig": {"parentMinor": 1, "profileId": profile.id, "placement": profile.placements[0],
                    "created": true, "gpuInstanceId": gi, "computeInstanceId": ci}}]}),
        serde_json::json!({"namespace": "ml", "name": "starting", "uid": "u3", "state": "PrepareStarted",
            "devices": [{"requestNames": ["gpu"], "pool": "n1", "device": "gpu-0", "uuid": gpu0}]}),
    ];
    let mut checkpoint = Checkpoint::new("boot");
    for entry in entries {
        let uid = entry["uid"].as_str().expect("uid").to_string();
        checkpoint
            .claims
            .insert(uid, serde_json::from_value(entry).expect("claim entry"));
    }
    let metrics = Metrics::new();
    metrics.observe_prepared_devices(&checkpoint, &inventory);
    let text = metrics.encode().expect("encodes");
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("gpu_dra_prepared_device_info{"))
        .collect();
    assert_eq!(series.len(), 2, "{text}");
    let whole = format!(
        r#"gpu_dra_prepared_device_info{{namespace="ml",claim="whole",claim_uid="u1",request="gpu",pods="",dra_device="gpu-0",UUID="{gpu0}",GPU_I_ID="",GPU_I_PROFILE="",compute_instance_id="",mig_uuid="",Hostname="n1",sharing="shared-mps",consumed="memory=20Gi",admin_access="false"}} 1"#
    );
    assert!(series.contains(&whole.as_str()), "{whole}\nnot in\n{text}");
    let mig = series
        .iter()
        .find(|l| l.contains(r#"claim="mig""#))
        .expect("the MIG claim's series");
    for label in [
        format!(r#"UUID="{gpu1}""#),
        format!(r#"GPU_I_ID="{gi}""#),
        format!(r#"GPU_I_PROFILE="{}""#, profile.name),
        format!(r#"compute_instance_id="{ci}""#),
        format!(r#"mig_uuid="{mig_uuid}""#),
        r#"sharing="exclusive""#.to_string(),
    ] {
        assert!(mig.contains(&label), "{label} in {mig}");
    }

    // Use, as the reader sees it every --usage-interval: a process on the whole GPU, one on the
    // MIG device and one on another GPU instance (not the claim's).
    let process = |pid, gi: Option<u32>, mib: u64, sm| crate::gpu::sim::SimProcess {
        usage: crate::gpu::usage::ProcessUsage {
            pid,
            memory_used_bytes: Some(mib << 20),
            gpu_instance_id: gi,
            compute_instance_id: gi.map(|_| 0),
        },
        sm_percent: sm,
    };
    sim.set_process(0, 100, Some(process(100, None, 4096, 40)))
        .expect("process on gpu-0");
    sim.set_process(1, 200, Some(process(200, Some(gi), 2048, 0)))
        .expect("process on the MIG device");
    let other = sim
        .create_gpu_instance(1, profile.id, profile.placements[1])
        .expect("another GPU instance");
    sim.set_process(1, 201, Some(process(201, Some(other), 1024, 0)))
        .expect("process on another MIG device");
    assert_eq!(
        metrics.usage_targets(),
        std::collections::BTreeSet::from([0, 1])
    );
    let usage = metrics
        .usage_targets()
        .into_iter()
        .map(|minor| (minor, sim.usage(minor).expect("usage")))
        .collect();
    metrics.observe_usage(&usage, &Default::default());
    let text = metrics.encode().expect("encodes");
    let whole_labels = format!(
        r#"{{namespace="ml",claim="whole",claim_uid="u1",dra_device="gpu-0",UUID="{gpu0}",GPU_I_ID="",Hostname="n1"}}"#
    );
    let mig_labels = format!(
        r#"{{namespace="ml",claim="mig",claim_uid="u2",dra_device="gpu-1-mig-{}-{}-0",UUID="{gpu1}",GPU_I_ID="{gi}",Hostname="n1"}}"#,
        profile.name.replace('.', ""),
        profile.id
    );
    assert_samples(
        &text,
        &[
            (
                &format!("gpu_dra_claim_device_memory_used_bytes{whole_labels}"),
                (4096u64 << 20) as f64,
            ),
            (
                &format!("gpu_dra_claim_device_utilization_ratio{whole_labels}"),
                0.4,
            ),
            (
                &format!("gpu_dra_claim_device_processes{whole_labels}"),
                1.0,
            ),
            (
                &format!("gpu_dra_claim_device_memory_used_bytes{mig_labels}"),
                (2048u64 << 20) as f64,
            ),
            (&format!("gpu_dra_claim_device_processes{mig_labels}"), 1.0),
        ],
    );
    // NVML has no utilization per MIG device: no series rather than a made-up one.
    assert!(
        !text.contains(&format!(
            "gpu_dra_claim_device_utilization_ratio{mig_labels}"
        )),
        "{text}"
    );

    // The pods a claim is reserved for show as soon as the driver reads them.
    let user = |pod: &str, uid: &str| crate::prepare::driver::ClaimUser {
        pod: pod.into(),
        uid: uid.into(),
    };
    metrics.observe_claim_pods(
        "u2",
        &[
            user("ml/trainer-0", "0b7e2f4c-1a2b-4c3d-8e9f-000000000000"),
            user("ml/trainer-1", "0b7e2f4c-1a2b-4c3d-8e9f-000000000001"),
        ],
    );
    // The MIG device's process runs in trainer-1's cgroup: that pod's series.
    metrics.observe_usage(
        &usage,
        &std::collections::BTreeMap::from([(
            200,
            "0b7e2f4c-1a2b-4c3d-8e9f-000000000001".to_string(),
        )]),
    );
    let text = metrics.encode().expect("encodes");
    assert_samples(
        &text,
        &[(
            &format!(
                r#"gpu_dra_pod_device_memory_used_bytes{{namespace="ml",pod="trainer-1",claim="mig",claim_uid="u2",dra_device="gpu-1-mig-{}-{}-0",UUID="{gpu1}",GPU_I_ID="{gi}",Hostname="n1"}}"#,
                profile.name.replace('.', ""),
                profile.id
            ),
            (2048u64 << 20) as f64,
        )],
    );
    assert!(!text.contains(r#"pod="trainer-0""#), "{text}");
    let text = metrics.encode().expect("encodes");
    assert!(
        text.lines()
            .any(|l| l.contains(r#"claim="mig""#)
                && l.contains(r#"pods="ml/trainer-0,ml/trainer-1""#)),
        "{text}"
    );

    // Unprepared: its series goes, and what was known of its pods.
    checkpoint.claims.remove("u2");
    metrics.observe_prepared_devices(&checkpoint, &inventory);
    let text = metrics.encode().expect("encodes");
    assert!(!text.contains(r#"claim="mig""#), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("gpu_dra_prepared_device_info{"))
            .count(),
        1
    );
}

/// Fault taints, kubelet's registration and MPS daemon restarts, as the alert rules read them.
#[test]
fn taints_registration_and_mps_restarts_are_exported_for_alerts() {
    use k8s_openapi::api::resource::v1::DeviceTaint;
    let metrics = Metrics::new();
    let text = metrics.encode().expect("encodes");
    assert_samples(
        &text,
        &[
            ("gpu_dra_registered", 0.0),
            ("gpu_dra_mps_daemon_restarts_total", 0.0),
        ],
    );
    let taint = |key: &str, effect: &str| DeviceTaint {
        key: key.into(),
        effect: effect.into(),
        ..DeviceTaint::default()
    };
    metrics.observe_device_taints(&std::collections::BTreeMap::from([(
        "gpu-0".to_string(),
        vec![
            taint("gpu.nvidia.com/xid", "NoSchedule"),
            taint("gpu.nvidia.com/gpu-lost", "NoExecute"),
        ],
    )]));
    metrics.observe_registration(&KubeletRegistration::Registered);
    metrics.observe_mps_restarts(2);
    let text = metrics.encode().expect("encodes");
    assert_samples(
        &text,
        &[
            (
                r#"gpu_dra_device_taint{device="gpu-0",key="gpu.nvidia.com/xid",effect="NoSchedule"}"#,
                1.0,
            ),
            (
                r#"gpu_dra_device_taint{device="gpu-0",key="gpu.nvidia.com/gpu-lost",effect="NoExecute"}"#,
                1.0,
            ),
            ("gpu_dra_registered", 1.0),
            ("gpu_dra_mps_daemon_restarts_total", 2.0),
        ],
    );
    // Healed: the series go.
    metrics.observe_device_taints(&Default::default());
    let text = metrics.encode().expect("encodes");
    assert!(!text.contains("gpu_dra_device_taint{"), "{text}");
}

#[test]
fn a_process_pod_comes_from_its_cgroup() {
    use super::pod_uid_of_cgroup;
    let uid = "3f1e2d4c-5b6a-4978-8a9b-0c1d2e3f4a5b";
    // cgroup v2, systemd driver.
    let systemd = format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-abc.scope\n",
        uid.replace('-', "_")
    );
    assert_eq!(pod_uid_of_cgroup(&systemd).as_deref(), Some(uid));
    // cgroup v1, cgroupfs driver.
    let cgroupfs = format!(
        "12:memory:/kubepods/besteffort/pod{uid}/0123abcd\n11:pids:/kubepods/besteffort/pod{uid}/0123abcd\n"
    );
    assert_eq!(pod_uid_of_cgroup(&cgroupfs).as_deref(), Some(uid));
    assert_eq!(pod_uid_of_cgroup("0::/system.slice/sshd.service\n"), None);
}

/// The ComputeDomain channel plugin's calls and prepared devices count in NVIDIA's series under
/// its driver name, beside the GPU driver's.
#[tokio::test]
async fn another_plugins_calls_count_under_its_driver_name() {
    use crate::prepare::{NodeDriver, PrepareResult, UnprepareResult};
    use std::sync::atomic::{AtomicUsize, Ordering};
    /// Holds one channel per prepared claim; one was prepared before this start.
    struct Channels(AtomicUsize);
    #[tonic::async_trait]
    impl NodeDriver for Channels {
        async fn prepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, PrepareResult)> {
            claims
                .into_iter()
                .map(|c| {
                    let result = if c.name == "bad" {
                        Err("no domain".to_string())
                    } else {
                        self.0.fetch_add(1, Ordering::SeqCst);
                        Ok(vec![])
                    };
                    (c, result)
                })
                .collect()
        }
        async fn unprepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, UnprepareResult)> {
            self.0.fetch_sub(claims.len(), Ordering::SeqCst);
            claims.into_iter().map(|c| (c, Ok(()))).collect()
        }
        fn prepared_device_counts(&self) -> Vec<(&'static str, usize)> {
            vec![("channel", self.0.load(Ordering::SeqCst)), ("daemon", 0)]
        }
    }
    let metrics = Arc::new(Metrics::for_node("gpu.nvidia.com", "node-1"));
    let driver = MeasuredDriver::new(
        Arc::new(Channels(AtomicUsize::new(1))),
        "compute-domain.nvidia.com",
        metrics.clone(),
    );
    let cd = r#"driver="compute-domain.nvidia.com""#;
    let channels =
        format!(r#"nvidia_dra_prepared_devices{{node="node-1",{cd},device_type="channel"}}"#);
    let daemons =
        format!(r#"nvidia_dra_prepared_devices{{node="node-1",{cd},device_type="daemon"}}"#);
    let text = metrics.encode().expect("encodes");
    assert_samples(&text, &[(&channels, 1.0), (&daemons, 0.0)]);
    let bad = ClaimRef {
        name: "bad".into(),
        ..claim()
    };
    driver.prepare(vec![claim(), bad]).await;
    let text = metrics.encode().expect("encodes");
    assert_samples(&text, &[(&channels, 2.0)]);
    driver.unprepare(vec![claim()]).await;
    let text = metrics.encode().expect("encodes");
    assert_samples(&text, &[(&channels, 1.0)]);
    assert_samples(
        &text,
        &[
            (
                &format!(r#"nvidia_dra_requests_total{{{cd},operation="prepare"}}"#),
                1.0,
            ),
            (
                &format!(r#"nvidia_dra_requests_total{{{cd},operation="unprepare"}}"#),
                1.0,
            ),
            (
                &format!(r#"nvidia_dra_requests_inflight{{{cd},operation="prepare"}}"#),
                0.0,
            ),
            (
                &format!(
                    r#"nvidia_dra_node_prepare_errors_total{{{cd},error_type="prepare_devices"}}"#
                ),
                1.0,
            ),
            // The GPU driver's own series are untouched.
            (
                r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"}"#,
                0.0,
            ),
        ],
    );
}
