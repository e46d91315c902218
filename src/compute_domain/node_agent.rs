//! The ComputeDomain half of the node agent (`gpu-dra run --compute-domains`): starts the
//! channel plugin beside the GPU one, publishes its pool, and keeps its IMEX daemons, this node's
//! entries in the domains and the clique label current until shutdown.
//!
//! The node agent (`crate::node`) calls [`start_compute_domains`] with [`NodeSettings`] and wraps
//! [`StartError`] in its own error; nothing here names `crate::node`, so the two modules form no
//! import circle.
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::options::{ComputeDomainOptions, NodeSettings};
use crate::metrics::Metrics;
use crate::plugin::{PluginConfig, PluginError, PluginServer};
use crate::prepare::claims::{ClaimSource, KubeClaims};
use crate::prepare::lock;
use crate::slices::SliceOptions;
use crate::slices::publish::Publisher;

/// Why the ComputeDomain plugin did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("Kubernetes client: {0}")]
    Kube(String),
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

/// The node's address for IMEX peers: the Node's first InternalIP.
async fn node_internal_ip(
    client: &kube::Client,
    node: &str,
    timeout: Duration,
) -> Result<String, StartError> {
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let object = crate::kubeapi::bounded(timeout, api.get(node))
        .await
        .map_err(|e| StartError::Kube(format!("get Node {node}: {e}")))?;
    object
        .status
        .and_then(|s| s.addresses)
        .into_iter()
        .flatten()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .ok_or_else(|| {
            StartError::Kube(format!(
                "Node {node} has no InternalIP address for IMEX peers; give --node-ip"
            ))
        })
}

/// Starts the `compute-domain.nvidia.com` plugin: its sockets, its pool (channel 0) and the
/// loop that keeps its IMEX daemons and this node's entries in the domains current.
pub(crate) async fn start_compute_domains(
    cd: &ComputeDomainOptions,
    settings: &NodeSettings,
    metrics: Arc<Metrics>,
    client: kube::Client,
    control: Arc<dyn crate::gpu::GpuControl>,
    presence: Option<lock::PresenceView>,
    shutdown: watch::Receiver<bool>,
) -> Result<(PluginServer, Vec<tokio::task::JoinHandle<()>>), StartError> {
    use crate::compute_domain::{self, imex::ImexDaemons, node::ChannelPlugin};
    let node_name = settings.node_name.clone();
    let node_ip = match &cd.node_ip {
        Some(ip) => ip.clone(),
        None => node_internal_ip(&client, &node_name, settings.request_timeout).await?,
    };
    let daemons = ImexDaemons::new(cd.tools.clone(), cd.state_dir.join("domains"));
    // Only nodes with multi-node NVLink run IMEX daemons; one whose fabric cannot be read yet
    // is checked as well (it will have it).
    let fabric = compute_domain::node::node_clique(control.as_ref());
    if fabric.as_deref() != Ok("") && cd.imex == compute_domain::node::ImexMode::DriverManaged {
        daemons
            .check()
            .map_err(|e| StartError::Kube(format!("--compute-domains: {e}")))?;
    }
    let claims: Arc<dyn ClaimSource> = Arc::new(
        KubeClaims::on_node(
            client.clone(),
            compute_domain::DRIVER_NAME,
            Some(&node_name),
        )
        .with_timeout(settings.request_timeout),
    );
    let plugin = ChannelPlugin::new(
        client.clone(),
        claims,
        compute_domain::node::ChannelPluginOptions {
            node_name: node_name.clone(),
            node_ip: node_ip.clone(),
            credentials_namespace: cd
                .credentials_namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string()),
            state_dir: cd.state_dir.clone(),
            cdi_root: cd.cdi_root.clone(),
            dev_root: settings.dev_root.clone(),
            ready_timeout: cd.ready_timeout,
            simulated: control.simulated(),
            imex: cd.imex.clone(),
        },
        daemons,
        control.clone(),
    )
    .map_err(|e| StartError::Kube(format!("--compute-domains: {e}")))?;
    let plugin = Arc::new(plugin);
    let (slices_tx, slices_rx) = watch::channel(Arc::new(plugin.slices()));
    let measured =
        crate::metrics::MeasuredDriver::new(plugin.clone(), compute_domain::DRIVER_NAME, metrics);
    let server = PluginServer::start(PluginConfig::new(
        compute_domain::DRIVER_NAME,
        settings.registrar_dir.clone(),
        cd.plugin_dir.clone(),
        Arc::new(measured),
    ))
    .await?;
    tracing::info!(node_ip, clique = ?plugin.clique(), registration = %server.registration_socket_path().display(), "ComputeDomain plugin started");
    let mut label = cd.clique_label.then(|| {
        compute_domain::clique_label::CliqueLabel::new(
            client.clone(),
            node_name.clone(),
            settings.request_timeout,
        )
    });
    let publisher = Publisher::new(
        client,
        SliceOptions::new(compute_domain::DRIVER_NAME, &node_name),
        settings.request_timeout,
    );
    let publish = tokio::spawn(publisher.run(
        slices_rx,
        settings.resync_interval,
        shutdown.clone(),
        |_| {},
    ));
    let interval = settings.reconcile_interval;
    let mut stop = shutdown;
    let maintain = tokio::spawn(async move {
        loop {
            plugin.reconcile().await;
            // The clique, once it could be read, joins the published channel (and the label).
            let slices = plugin.slices();
            if **slices_tx.borrow() != slices {
                let _ = slices_tx.send(Arc::new(slices));
            }
            if let (Some(label), Ok(clique)) = (label.as_mut(), plugin.clique()) {
                label.follow(&clique).await;
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.changed() => break,
            }
        }
        // In a rolling update the other instance keeps the label true: removing it would
        // leave the node unlabelled until that instance re-asserts it (minutes).
        let others = presence
            .as_ref()
            .and_then(|p| p.others().ok())
            .map(|o| o.alive)
            .unwrap_or_default();
        match &label {
            Some(_) if !others.is_empty() => {
                tracing::info!(instances = ?others, "another driver instance runs on the node: the clique label stays")
            }
            Some(label) => label.remove().await,
            None => {}
        }
    });
    Ok((server, vec![publish, maintain]))
}
