//! Starts and stops the kubelet plugin: the DRA socket (DRA v1 + v1beta1, device health, gRPC
//! health for probes) and the registration socket kubelet's plugin watcher discovers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::transport::server::Router;

use super::authority::NormalizeAuthority;
use super::dra::{DraV1Service, DraV1beta1Service};
use super::error::PluginError;
use super::health::{HealthReporter, HealthV1Service, HealthV1alpha1Service};
use super::proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration};
use super::registration::{KubeletRegistration, RegistrationService};
use super::shutdown::{ShutdownSignal, ShutdownTrigger, shutdown_channel};
use super::socket::{OwnedSocket, bind_private_socket, ensure_private_dir};
use crate::prepare::NodeDriver;

/// File name of the DRA service socket inside the plugin directory (as the Go library names it).
pub const DRA_SOCKET_NAME: &str = "dra.sock";

/// How the plugin is wired to kubelet and the driver.
#[derive(Clone)]
pub struct PluginConfig {
    /// The DRA driver name, e.g. `gpu.nvidia.com`.
    pub driver_name: String,
    /// Kubelet's plugin registry, watched by kubelet (`/var/lib/kubelet/plugins_registry`).
    pub registrar_dir: PathBuf,
    /// This driver's own directory (`/var/lib/kubelet/plugins/<driver>`); must be the same path
    /// inside and outside the container, since kubelet dials the socket path we report.
    pub plugin_dir: PathBuf,
    pub driver: Arc<dyn NodeDriver>,
    /// Also list the device health services in `supported_versions`. A 1.37 kubelet only opens a
    /// health stream when they are listed; older kubelets with the gate on open one regardless.
    pub advertise_health: bool,
    /// How long [`PluginServer::shutdown`] lets in-flight calls finish before aborting them.
    pub shutdown_grace: Duration,
    /// Rolling update: this instance's id (the pod UID). Kubelet accepts several registrations of
    /// one driver from different sockets and uses the newest, so each instance gets sockets of
    /// its own and old and new can overlap.
    pub instance: Option<String>,
}

impl PluginConfig {
    pub fn new(
        driver_name: impl Into<String>,
        registrar_dir: impl Into<PathBuf>,
        plugin_dir: impl Into<PathBuf>,
        driver: Arc<dyn NodeDriver>,
    ) -> Self {
        Self {
            driver_name: driver_name.into(),
            registrar_dir: registrar_dir.into(),
            plugin_dir: plugin_dir.into(),
            driver,
            advertise_health: false,
            shutdown_grace: Duration::from_secs(5),
            instance: None,
        }
    }

    /// `<registrar-dir>/<driver>-reg.sock`; with an instance id `<driver>-<id>-reg.sock`, or a
    /// shorter name derived from the id where that would not fit a unix socket address.
    pub fn registration_socket_path(&self) -> PathBuf {
        let Some(instance) = &self.instance else {
            return self
                .registrar_dir
                .join(format!("{}-reg.sock", self.driver_name));
        };
        let digest = short_digest(&self.driver_name, instance);
        [
            format!("{}-{instance}-reg.sock", self.driver_name),
            format!("{}-{}-reg.sock", self.driver_name, &digest[..8]),
            format!("dra-{digest}-reg.sock"),
        ]
        .into_iter()
        .map(|name| self.registrar_dir.join(name))
        .find(|path| path.as_os_str().len() + STAGING_EXTRA < MAX_SOCKET_PATH)
        .unwrap_or_else(|| self.registrar_dir.join(format!("dra-{digest}-reg.sock")))
    }

    /// `<plugin-dir>/dra.sock`; with an instance id `<plugin-dir>/dra-<id>.sock`, or a shorter
    /// name derived from the id where that would not fit a unix socket address (a long
    /// `kubeletDir`, e.g. microk8s', plus a pod UID would otherwise stop every upgraded pod).
    pub fn dra_socket_path(&self) -> PathBuf {
        let Some(instance) = &self.instance else {
            return self.plugin_dir.join(DRA_SOCKET_NAME);
        };
        let digest = short_digest(&self.driver_name, instance);
        [format!("dra-{instance}.sock"), format!("dra-{digest}.sock")]
            .into_iter()
            .map(|name| self.plugin_dir.join(name))
            .find(|path| path.as_os_str().len() + STAGING_EXTRA < MAX_SOCKET_PATH)
            .unwrap_or_else(|| self.plugin_dir.join(format!("dra-{}.sock", &digest[..8])))
    }
}

/// `sockaddr_un.sun_path` holds 108 bytes with the terminating NUL.
const MAX_SOCKET_PATH: usize = 108;
/// A socket is bound as `.<name>.tmp` first (see `bind_private_socket`).
const STAGING_EXTRA: usize = ".".len() + ".tmp".len();

/// 16 hex digits that name an instance of a driver (a name-based UUID of both).
fn short_digest(driver: &str, instance: &str) -> String {
    let id = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{driver}\0{instance}").as_bytes(),
    );
    id.simple().to_string()[..16].to_string()
}

/// A gRPC server on one socket.
struct ServedSocket {
    socket: OwnedSocket,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// The running kubelet plugin. Dropping it stops serving and removes the sockets without waiting;
/// [`PluginServer::shutdown`] does the same in order and reports what failed.
pub struct PluginServer {
    dra: ServedSocket,
    registration: ServedSocket,
    registration_state: watch::Receiver<KubeletRegistration>,
    device_health: HealthReporter,
    probes: tonic_health::server::HealthReporter,
    shutdown: ShutdownTrigger,
    shutdown_grace: Duration,
}

/// Why `name` cannot be part of a socket file name, if it cannot.
fn socket_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("empty")
    } else if name.contains(['/', '\0']) {
        Some("contains '/' or NUL, so it cannot name a socket file")
    } else {
        None
    }
}

fn validate_names(config: &PluginConfig) -> Result<(), PluginError> {
    if let Some(reason) = socket_name_problem(&config.driver_name) {
        return Err(PluginError::InvalidDriverName {
            name: config.driver_name.clone(),
            reason,
        });
    }
    if let Some(id) = &config.instance
        && let Some(reason) = socket_name_problem(id)
    {
        return Err(PluginError::InvalidInstance {
            id: id.clone(),
            reason,
        });
    }
    Ok(())
}

/// Kubelet needs the absolute DRA socket path in `PluginInfo.endpoint`.
fn absolute(path: &Path) -> Result<PathBuf, PluginError> {
    std::path::absolute(path).map_err(|source| PluginError::AbsolutePath {
        path: path.to_path_buf(),
        source,
    })
}

/// How connections on a socket reach its gRPC server.
#[derive(Clone, Copy)]
enum Connections {
    AsAccepted,
    /// Through [`NormalizeAuthority`]: for the socket kubelet's plugin watcher dials.
    NormalizeAuthority,
}

fn serve(
    router: Router,
    listener: UnixListener,
    socket: OwnedSocket,
    shutdown: ShutdownSignal,
    connections: Connections,
) -> ServedSocket {
    let path = socket.path().to_path_buf();
    let incoming = UnixListenerStream::new(listener);
    let task = match connections {
        Connections::AsAccepted => spawn_server(router, incoming, path, shutdown),
        Connections::NormalizeAuthority => spawn_server(
            router,
            incoming.map(|accepted| accepted.map(NormalizeAuthority::new)),
            path,
            shutdown,
        ),
    };
    ServedSocket { socket, task }
}

fn spawn_server<I, IO>(
    router: Router,
    incoming: I,
    path: PathBuf,
    shutdown: ShutdownSignal,
) -> JoinHandle<Result<(), tonic::transport::Error>>
where
    I: tokio_stream::Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let result = router
            .serve_with_incoming_shutdown(incoming, shutdown.triggered())
            .await;
        if let Err(error) = &result {
            tracing::error!(path = %path.display(), %error, "gRPC server stopped with an error");
        }
        result
    })
}

impl PluginServer {
    /// Creates the directories and sockets and starts serving: the DRA socket first, then the
    /// registration socket, because kubelet dials the DRA endpoint as soon as it has registered us.
    pub async fn start(config: PluginConfig) -> Result<Self, PluginError> {
        validate_names(&config)?;
        let config = PluginConfig {
            registrar_dir: absolute(&config.registrar_dir)?,
            plugin_dir: absolute(&config.plugin_dir)?,
            ..config
        };
        ensure_private_dir(&config.plugin_dir)?;
        ensure_private_dir(&config.registrar_dir)?;
        let (shutdown, shutdown_signal) = shutdown_channel();

        let dra_v1_service = DraV1Service::new(config.driver.clone());
        let dra_v1beta1_service = DraV1beta1Service::new(dra_v1_service.clone());
        let device_health = HealthReporter::new();
        let health_v1_service =
            HealthV1Service::new(device_health.clone(), shutdown_signal.clone());
        let health_v1alpha1_service = HealthV1alpha1Service::new(health_v1_service.clone());
        let (probes, probe_service) = tonic_health::server::health_reporter();
        probes
            .set_serving::<dra_v1::dra_plugin_server::DraPluginServer<DraV1Service>>()
            .await;
        probes
            .set_serving::<dra_v1beta1::dra_plugin_server::DraPluginServer<DraV1beta1Service>>()
            .await;

        let dra_router = Server::builder()
            .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(
                dra_v1_service,
            ))
            .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(
                dra_v1beta1_service,
            ))
            .add_service(
                health_v1::dra_resource_health_server::DraResourceHealthServer::new(
                    health_v1_service,
                ),
            )
            .add_service(
                health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                    health_v1alpha1_service,
                ),
            )
            .add_service(probe_service);
        let dra_path = config.dra_socket_path();
        let (listener, socket) = bind_private_socket(&dra_path)?;
        let dra = serve(
            dra_router,
            listener,
            socket,
            shutdown_signal.clone(),
            Connections::AsAccepted,
        );

        let registration_service =
            RegistrationService::new(&config.driver_name, dra_path, config.advertise_health);
        let registration_state = registration_service.subscribe();
        let registration_router = Server::builder().add_service(
            registration::registration_server::RegistrationServer::new(registration_service),
        );
        // If this fails, `dra` is dropped on return: its socket is removed and its server stopped.
        let (listener, socket) = bind_private_socket(&config.registration_socket_path())?;
        let registration = serve(
            registration_router,
            listener,
            socket,
            shutdown_signal,
            Connections::NormalizeAuthority,
        );

        tracing::info!(
            driver = %config.driver_name,
            dra_socket = %dra.socket.path().display(),
            registration_socket = %registration.socket.path().display(),
            "kubelet plugin serving"
        );
        Ok(Self {
            dra,
            registration,
            registration_state,
            device_health,
            probes,
            shutdown,
            shutdown_grace: config.shutdown_grace,
        })
    }

    /// Kubelet's latest verdict on our registration; `wait_for` it to gate readiness.
    pub fn registration(&self) -> watch::Receiver<KubeletRegistration> {
        self.registration_state.clone()
    }

    /// Where the driver reports device health for kubelet's health streams.
    pub fn device_health(&self) -> HealthReporter {
        self.device_health.clone()
    }

    pub fn dra_socket_path(&self) -> &Path {
        self.dra.socket.path()
    }

    pub fn registration_socket_path(&self) -> &Path {
        self.registration.socket.path()
    }

    /// Stops the plugin: removes the registration socket first (kubelet deregisters us), lets
    /// in-flight calls finish within the grace period, then removes the DRA socket. Every step
    /// runs even if an earlier one failed; the first error is returned.
    pub async fn shutdown(self) -> Result<(), PluginError> {
        let Self {
            mut dra,
            mut registration,
            probes,
            shutdown,
            shutdown_grace,
            ..
        } = self;
        let mut errors = Vec::new();
        errors.extend(registration.socket.remove().err());
        probes
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        shutdown.trigger();

        let deadline = Instant::now() + shutdown_grace;
        for served in [&mut registration, &mut dra] {
            errors.extend(stop_within(served, deadline, shutdown_grace).await.err());
        }
        errors.extend(dra.socket.remove().err());
        tracing::info!("kubelet plugin stopped");
        match errors.into_iter().next() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

async fn stop_within(
    served: &mut ServedSocket,
    deadline: Instant,
    grace: Duration,
) -> Result<(), PluginError> {
    let path = served.socket.path().to_path_buf();
    match tokio::time::timeout_at(deadline, &mut served.task).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(source))) => Err(PluginError::Serve { path, source }),
        Ok(Err(source)) => Err(PluginError::ServerTask { path, source }),
        Err(_elapsed) => {
            served.task.abort();
            tracing::warn!(path = %path.display(), ?grace, "in-flight calls did not finish; aborted the server");
            Err(PluginError::StopTimeout { path, grace })
        }
    }
}
