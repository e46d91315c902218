//! The refusing mode: an agent whose checkpoint cannot be trusted serves kubelet only to refuse
//! every call with the reason, and touches nothing on the node.
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::events::{NodeEvent, report_on_node};
use super::options::with_metrics_auth;
use super::{NodeAgent, NodeError, NodeOptions, kube_client, plugin_config};
use crate::metrics::{Metrics, MetricsServer};
use crate::plugin::PluginServer;
use crate::prepare::checkpoint::CheckpointError;
use crate::prepare::{ClaimRef, NodeDriver, PrepareResult, UnprepareResult};

/// Answers kubelet while the node's state cannot be trusted: every call fails with the reason.
struct RefusingDriver {
    reason: String,
}

#[tonic::async_trait]
impl NodeDriver for RefusingDriver {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, PrepareResult)> {
        claims
            .into_iter()
            .map(|claim| (claim, Err(self.reason.clone())))
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, UnprepareResult)> {
        claims
            .into_iter()
            .map(|claim| (claim, Err(self.reason.clone())))
            .collect()
    }
}

impl NodeAgent {
    /// Fail closed: the checkpoint cannot be trusted, so nothing on the node is touched (no
    /// recovery, sweep, MIG destruction, publication or garbage collection). Kubelet still
    /// reaches the plugin and gets the reason with every call; an event on the Node and the
    /// `checkpoint_unusable` metric tell the operator, and readiness stays false.
    pub(super) async fn start_refusing(
        options: NodeOptions,
        metrics: Arc<Metrics>,
        metrics_server: Option<MetricsServer>,
        error: CheckpointError,
        started: Instant,
    ) -> Result<Self, NodeError> {
        let reason = error.to_string();
        tracing::error!(error = %reason, "refusing to prepare or unprepare any claim");
        metrics.observe_checkpoint_unusable();
        let client = kube_client(options.kubeconfig.as_deref(), &options.api_timeouts).await?;
        let node_name = options.discovery.node_name.clone();
        let event = NodeEvent {
            warning: true,
            reason: "CheckpointUnusable",
            action: "Recover",
            note: &reason,
        };
        let report = report_on_node(&client, &node_name, &options.driver_name, event);
        if let Err(e) = crate::kubeapi::bounded(options.api_timeouts.request, report).await {
            tracing::warn!(error = %e, node = %node_name, "cannot record the refusal as a Node event");
        }
        let plugin =
            PluginServer::start(plugin_config(&options, Arc::new(RefusingDriver { reason })))
                .await?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = vec![
            metrics
                .clone()
                .follow_registration(plugin.registration(), shutdown_rx.clone()),
        ];
        if let Some(server) = metrics_server {
            let server = with_metrics_auth(server, options.metrics_auth, &client);
            let metrics = metrics.clone();
            tasks.push(tokio::spawn(async move {
                if let Err(e) = server.serve(metrics, shutdown_rx).await {
                    tracing::error!(error = %e, "metrics endpoint stopped");
                }
            }));
        }
        Ok(Self {
            compute_domain_plugin: None,
            plugin,
            driver: None,
            metrics,
            shutdown,
            tasks,
            started,
        })
    }
}
