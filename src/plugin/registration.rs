//! The kubelet plugin registration service, served on `<registrar-dir>/<driver>-reg.sock`.
//!
//! Kubelet's plugin watcher dials the socket as soon as it appears, asks `GetInfo` who we are and
//! where the DRA service lives, then reports its verdict with `NotifyRegistrationStatus`.

use std::path::PathBuf;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::Registration,
};

/// `PluginInfo.type` kubelet routes to its DRA handler.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";

/// DRA services we offer, in preference order: kubelet picks the first it supports, so v1 first.
pub const DRA_SERVICE_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// Health services, newest first (a 1.37 kubelet prefers v1, older ones only know v1alpha1).
pub const HEALTH_SERVICE_VERSIONS: [&str; 2] =
    ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];

/// What kubelet last said about our registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletRegistration {
    /// Kubelet has not called `NotifyRegistrationStatus` yet.
    Pending,
    Registered,
    /// Kubelet refused the plugin; the text is kubelet's error.
    Rejected {
        error: String,
    },
}

/// Serves `pluginregistration.Registration` and publishes kubelet's verdict.
pub struct RegistrationService {
    info: PluginInfo,
    status: watch::Sender<KubeletRegistration>,
}

impl RegistrationService {
    /// `dra_endpoint` must be the DRA socket path as kubelet sees it (absolute).
    pub fn new(driver_name: &str, dra_endpoint: PathBuf, advertise_health: bool) -> Self {
        let mut supported_versions: Vec<String> =
            DRA_SERVICE_VERSIONS.iter().map(|v| v.to_string()).collect();
        if advertise_health {
            supported_versions.extend(HEALTH_SERVICE_VERSIONS.iter().map(|v| v.to_string()));
        }
        let info = PluginInfo {
            r#type: DRA_PLUGIN_TYPE.to_string(),
            name: driver_name.to_string(),
            endpoint: dra_endpoint.to_string_lossy().into_owned(),
            supported_versions,
        };
        let (status, _) = watch::channel(KubeletRegistration::Pending);
        Self { info, status }
    }

    /// Follows kubelet's verdicts; starts at [`KubeletRegistration::Pending`].
    pub fn subscribe(&self) -> watch::Receiver<KubeletRegistration> {
        self.status.subscribe()
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!(driver = %self.info.name, endpoint = %self.info.endpoint, "kubelet asked for plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let verdict = request.into_inner();
        let state = if verdict.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with kubelet");
            KubeletRegistration::Registered
        } else {
            tracing::error!(driver = %self.info.name, error = %verdict.error, "kubelet rejected the plugin registration");
            KubeletRegistration::Rejected {
                error: verdict.error,
            }
        };
        self.status.send_replace(state);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
