//! The plugin over real unix sockets in a temp dir, driven by tonic clients as kubelet would.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use futures::StreamExt;
use tonic::transport::{Channel, Endpoint};

use super::proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration};
use super::*;
use crate::prepare::{ClaimRef, NodeDriver, PrepareResult, PreparedDevice, UnprepareResult};

const DRIVER: &str = "gpu.nvidia.com";
/// Claims with this UID fail in the fake driver.
const BAD_UID: &str = "uid-bad";

/// Prepares every claim onto one device named after it, except [`BAD_UID`]; records the calls.
#[derive(Default)]
struct FakeDriver {
    calls: Mutex<Vec<(&'static str, Vec<ClaimRef>)>>,
}

impl FakeDriver {
    fn calls(&self) -> Vec<(&'static str, Vec<ClaimRef>)> {
        self.calls.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl NodeDriver for FakeDriver {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, PrepareResult)> {
        self.calls.lock().unwrap().push(("prepare", claims.clone()));
        claims
            .into_iter()
            .map(|claim| {
                let result = if claim.uid == BAD_UID {
                    Err("device gpu-9 does not exist".to_string())
                } else {
                    Ok(vec![PreparedDevice {
                        request_names: vec!["gpu/large".into()],
                        pool_name: "node-a".into(),
                        device_name: format!("gpu-of-{}", claim.name),
                        cdi_device_ids: vec![format!(
                            "k8s.gpu.nvidia.com/claim={}-gpu-0",
                            claim.uid
                        )],
                        share_id: Some("share-1".into()),
                    }])
                };
                (claim, result)
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, UnprepareResult)> {
        self.calls
            .lock()
            .unwrap()
            .push(("unprepare", claims.clone()));
        claims
            .into_iter()
            .map(|claim| {
                let result = if claim.uid == BAD_UID {
                    Err("busy".to_string())
                } else {
                    Ok(())
                };
                (claim, result)
            })
            .collect()
    }
}

struct Harness {
    _dir: tempfile::TempDir,
    config: PluginConfig,
    driver: Arc<FakeDriver>,
}

/// Directories that do not exist yet, nested, so `start` has to create them.
fn harness() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let driver = Arc::new(FakeDriver::default());
    let config = PluginConfig::new(
        DRIVER,
        dir.path().join("kubelet/plugins_registry"),
        dir.path().join("kubelet/plugins").join(DRIVER),
        driver.clone(),
    );
    Harness {
        _dir: dir,
        config,
        driver,
    }
}

async fn connect(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix:{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn v1_claim(name: &str, uid: &str) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test]
async fn get_info_describes_the_dra_endpoint_and_registration_status_is_published() {
    let h = harness();
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    let mut client = registration::registration_client::RegistrationClient::new(
        connect(&h.config.registration_socket_path()).await,
    );

    let info = client
        .get_info(registration::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(Path::new(&info.endpoint), h.config.dra_socket_path());
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );

    let mut state = server.registration();
    assert_eq!(*state.borrow(), KubeletRegistration::Pending);
    let rejected = registration::RegistrationStatus {
        plugin_registered: false,
        error: "version mismatch".into(),
    };
    client.notify_registration_status(rejected).await.unwrap();
    assert_eq!(
        *state.borrow_and_update(),
        KubeletRegistration::Rejected {
            error: "version mismatch".into()
        }
    );
    let accepted = registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    client.notify_registration_status(accepted).await.unwrap();
    assert_eq!(*state.borrow_and_update(), KubeletRegistration::Registered);

    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn health_services_are_advertised_when_asked() {
    let mut h = harness();
    h.config.advertise_health = true;
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    let mut client = registration::registration_client::RegistrationClient::new(
        connect(server.registration_socket_path()).await,
    );
    let info = client
        .get_info(registration::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn v1_prepare_answers_every_claim_and_a_failure_stays_in_its_own_entry() {
    let h = harness();
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    let mut client =
        dra_v1::dra_plugin_client::DraPluginClient::new(connect(server.dra_socket_path()).await);

    let request = dra_v1::NodePrepareResourcesRequest {
        claims: vec![v1_claim("good", "uid-good"), v1_claim("bad", BAD_UID)],
    };
    let response = client
        .node_prepare_resources(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims.len(), 2);
    let good = &response.claims["uid-good"];
    assert_eq!(good.error, "");
    assert_eq!(
        good.devices,
        [dra_v1::Device {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-of-good".into(),
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=uid-good-gpu-0".into()],
            share_id: Some("share-1".into()),
        }]
    );
    let bad = &response.claims[BAD_UID];
    assert_eq!(bad.error, "device gpu-9 does not exist");
    assert!(bad.devices.is_empty());

    let request = dra_v1::NodeUnprepareResourcesRequest {
        claims: vec![v1_claim("good", "uid-good"), v1_claim("bad", BAD_UID)],
    };
    let response = client
        .node_unprepare_resources(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims["uid-good"].error, "");
    assert_eq!(response.claims[BAD_UID].error, "busy");

    let calls = h.driver.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].0, "prepare");
    assert_eq!(
        calls[0].1[0],
        ClaimRef {
            namespace: "default".into(),
            name: "good".into(),
            uid: "uid-good".into()
        }
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn v1beta1_behaves_like_v1_without_share_id() {
    let h = harness();
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    let mut client = dra_v1beta1::dra_plugin_client::DraPluginClient::new(
        connect(server.dra_socket_path()).await,
    );
    let claim = |name: &str, uid: &str| dra_v1beta1::Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    };

    let request = dra_v1beta1::NodePrepareResourcesRequest {
        claims: vec![claim("good", "uid-good"), claim("bad", BAD_UID)],
    };
    let response = client
        .node_prepare_resources(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        response.claims["uid-good"],
        dra_v1beta1::NodePrepareResourceResponse {
            devices: vec![dra_v1beta1::Device {
                request_names: vec!["gpu".into()],
                pool_name: "node-a".into(),
                device_name: "gpu-of-good".into(),
                cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=uid-good-gpu-0".into()],
            }],
            error: String::new(),
        }
    );
    assert_eq!(
        response.claims[BAD_UID].error,
        "device gpu-9 does not exist"
    );

    let request = dra_v1beta1::NodeUnprepareResourcesRequest {
        claims: vec![claim("good", "uid-good")],
    };
    let response = client
        .node_unprepare_resources(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims.len(), 1);
    assert_eq!(response.claims["uid-good"].error, "");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_empty_request_gets_an_empty_answer_without_bothering_the_driver() {
    let h = harness();
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    let mut client =
        dra_v1::dra_plugin_client::DraPluginClient::new(connect(server.dra_socket_path()).await);
    let prepared = client
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest::default())
        .await
        .unwrap();
    assert!(prepared.into_inner().claims.is_empty());
    let unprepared = client
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest::default())
        .await
        .unwrap();
    assert!(unprepared.into_inner().claims.is_empty());
    assert!(h.driver.calls().is_empty());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn directories_are_0700_and_sockets_0600() {
    let h = harness();
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    assert_eq!(mode(&h.config.plugin_dir), 0o700);
    assert_eq!(mode(&h.config.registrar_dir), 0o700);
    for socket in [server.dra_socket_path(), server.registration_socket_path()] {
        assert!(
            std::fs::symlink_metadata(socket)
                .unwrap()
                .file_type()
                .is_socket()
        );
        assert_eq!(mode(socket), 0o600, "{}", socket.display());
    }
    // Nothing else (no staging socket) is left next to them.
    let entries = std::fs::read_dir(&h.config.plugin_dir).unwrap().count();
    assert_eq!(entries, 1);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_stale_socket_from_a_previous_run_is_replaced() {
    let h = harness();
    std::fs::create_dir_all(&h.config.plugin_dir).unwrap();
    std::fs::create_dir_all(&h.config.registrar_dir).unwrap();
    // A crashed run leaves socket files nobody listens on.
    for path in [
        h.config.dra_socket_path(),
        h.config.registration_socket_path(),
    ] {
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
    }
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    let mut client = registration::registration_client::RegistrationClient::new(
        connect(server.registration_socket_path()).await,
    );
    assert_eq!(
        client
            .get_info(registration::InfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .name,
        DRIVER
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_non_socket_file_at_the_socket_path_is_not_deleted() {
    let h = harness();
    std::fs::create_dir_all(&h.config.plugin_dir).unwrap();
    std::fs::write(h.config.dra_socket_path(), "precious").unwrap();
    let error = PluginServer::start(h.config.clone()).await.err().unwrap();
    assert!(matches!(error, PluginError::NotASocket { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains(&h.config.dra_socket_path().display().to_string()),
        "{error}"
    );
    assert_eq!(
        std::fs::read_to_string(h.config.dra_socket_path()).unwrap(),
        "precious"
    );
    assert!(!h.config.registration_socket_path().exists());
}

#[tokio::test]
async fn shutdown_removes_both_sockets_even_with_a_health_stream_open() {
    let h = harness();
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    let mut health = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
        connect(server.dra_socket_path()).await,
    );
    let mut stream = health
        .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        stream.message().await.unwrap().is_some(),
        "the current (empty) list comes first"
    );

    let stopping = tokio::time::timeout(Duration::from_secs(3), server.shutdown());
    stopping
        .await
        .expect("shutdown waited on the open stream")
        .unwrap();
    assert!(!h.config.dra_socket_path().exists());
    assert!(!h.config.registration_socket_path().exists());
    assert!(
        stream.message().await.map(|m| m.is_none()).unwrap_or(true),
        "the stream ended"
    );
}

#[tokio::test]
async fn dropping_the_server_removes_its_sockets() {
    let h = harness();
    drop(PluginServer::start(h.config.clone()).await.unwrap());
    assert!(!h.config.dra_socket_path().exists());
    assert!(!h.config.registration_socket_path().exists());
}

#[tokio::test]
async fn shutdown_leaves_a_successors_socket_alone() {
    let h = harness();
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    // A new instance replaced the registration socket while we were still running.
    std::fs::remove_file(h.config.registration_socket_path()).unwrap();
    let _successor =
        std::os::unix::net::UnixListener::bind(h.config.registration_socket_path()).unwrap();
    server.shutdown().await.unwrap();
    assert!(h.config.registration_socket_path().exists());
    assert!(!h.config.dra_socket_path().exists());
}

#[tokio::test]
async fn device_health_reaches_v1_and_v1alpha1_streams() {
    let h = harness();
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    let channel = connect(server.dra_socket_path()).await;
    let mut v1_stream =
        health_v1::dra_resource_health_client::DraResourceHealthClient::new(channel.clone())
            .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
    let mut alpha_stream =
        health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel)
            .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
    assert!(v1_stream.next().await.unwrap().unwrap().devices.is_empty());
    assert!(
        alpha_stream
            .next()
            .await
            .unwrap()
            .unwrap()
            .devices
            .is_empty()
    );

    server.device_health().update(DeviceHealth {
        pool_name: "node-a".into(),
        device_name: "gpu-0".into(),
        status: DeviceHealthStatus::Unhealthy,
        message: "XID 79: fallen off the bus".into(),
        last_updated: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        health_check_timeout: None,
    });
    let v1_devices = v1_stream.next().await.unwrap().unwrap().devices;
    assert_eq!(
        v1_devices,
        [health_v1::DeviceHealth {
            device: Some(health_v1::DeviceIdentifier {
                pool_name: "node-a".into(),
                device_name: "gpu-0".into()
            }),
            health: health_v1::HealthStatus::Unhealthy.into(),
            last_updated_time: 1_800_000_000,
            health_check_timeout_seconds: 0,
            message: "XID 79: fallen off the bus".into(),
        }]
    );
    let alpha_devices = alpha_stream.next().await.unwrap().unwrap().devices;
    assert_eq!(alpha_devices.len(), 1);
    assert_eq!(
        alpha_devices[0].health,
        health_v1alpha1::HealthStatus::Unhealthy as i32
    );
    assert_eq!(alpha_devices[0].message, "XID 79: fallen off the bus");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn grpc_health_probe_reports_serving() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let h = harness();
    let server = PluginServer::start(h.config.clone()).await.unwrap();
    let mut probe = HealthClient::new(connect(server.dra_socket_path()).await);
    for service in ["", "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"] {
        let request = HealthCheckRequest {
            service: service.into(),
        };
        let status = probe.check(request).await.unwrap().into_inner().status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unusable_driver_name_is_refused() {
    let mut h = harness();
    h.config.driver_name = "../escape".into();
    let error = PluginServer::start(h.config.clone()).await.err().unwrap();
    assert!(
        matches!(error, PluginError::InvalidDriverName { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn rolling_update_instances_serve_side_by_side_on_their_own_sockets() {
    let h = harness();
    let instance = |id: &str| PluginConfig {
        instance: Some(id.into()),
        ..h.config.clone()
    };
    let (old, new) = (instance("pod-uid-old"), instance("pod-uid-new"));
    assert_eq!(
        old.registration_socket_path(),
        h.config
            .registrar_dir
            .join(format!("{DRIVER}-pod-uid-old-reg.sock"))
    );
    assert_eq!(
        new.dra_socket_path(),
        h.config.plugin_dir.join("dra-pod-uid-new.sock")
    );
    let old_server = PluginServer::start(old.clone()).await.unwrap();
    let new_server = PluginServer::start(new.clone()).await.unwrap();
    for config in [&old, &new] {
        let mut client = registration::registration_client::RegistrationClient::new(
            connect(&config.registration_socket_path()).await,
        );
        let info = client
            .get_info(registration::InfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(Path::new(&info.endpoint), config.dra_socket_path());
    }
    // The old instance leaves; the new one keeps serving.
    old_server.shutdown().await.unwrap();
    assert!(!old.registration_socket_path().exists());
    assert!(!old.dra_socket_path().exists());
    let mut client =
        dra_v1::dra_plugin_client::DraPluginClient::new(connect(&new.dra_socket_path()).await);
    let response = client
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
            claims: vec![v1_claim("c", "uid-1")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims["uid-1"].error, "");
    new_server.shutdown().await.unwrap();
}

#[test]
fn rolling_update_socket_names_fit_a_unix_socket_address() {
    let driver = Arc::new(FakeDriver::default());
    let long_dir = format!("/{}", "d".repeat(60));
    let config = |instance: &str| PluginConfig {
        instance: Some(instance.into()),
        ..PluginConfig::new(DRIVER, &long_dir, "/plugins", driver.clone())
    };
    let uid = "0b3c1a52-5c43-4a8c-9b25-2b1b7b0a7c10";
    let path = config(uid).registration_socket_path();
    assert!(path.as_os_str().len() + ".tmp".len() + 1 < 108, "{path:?}");
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("{DRIVER}-")) && name.ends_with("-reg.sock"),
        "{name}"
    );
    // Distinct instances never share a socket, and the name is stable for one instance.
    assert_ne!(
        path,
        config("another-uid-0000-0000-000000000000").registration_socket_path()
    );
    assert_eq!(path, config(uid).registration_socket_path());

    // The DRA socket too, under a long plugin folder (microk8s' kubelet dir, say).
    let long_plugins = format!("/var/snap/microk8s/common/var/lib/kubelet/plugins/{DRIVER}");
    let dra = |instance: &str| PluginConfig {
        instance: Some(instance.into()),
        ..PluginConfig::new(DRIVER, "/reg", &long_plugins, driver.clone())
    };
    let path = dra(uid).dra_socket_path();
    assert!(path.as_os_str().len() + ".tmp".len() + 1 < 108, "{path:?}");
    assert!(path.starts_with(&long_plugins), "{path:?}");
    assert_ne!(
        path,
        dra("another-uid-0000-0000-000000000000").dra_socket_path()
    );
    assert_eq!(path, dra(uid).dra_socket_path());
    // Where the whole id fits, it is the name.
    let short = PluginConfig {
        instance: Some(uid.into()),
        ..PluginConfig::new(DRIVER, "/reg", "/p", driver.clone())
    };
    assert!(short.dra_socket_path().ends_with(format!("dra-{uid}.sock")));
}

#[tokio::test]
async fn an_unusable_instance_id_is_refused() {
    let h = harness();
    let config = PluginConfig {
        instance: Some("a/b".into()),
        ..h.config.clone()
    };
    assert!(matches!(
        PluginServer::start(config).await,
        Err(PluginError::InvalidInstance { .. })
    ));
}
