//! `gpu-dra compute-domain-controller`: the cluster half of ComputeDomains (see
//! [`crate::compute_domain::controller`]), run by the chart as a Deployment.
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::CliError;
use super::duration;

#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Only this namespace's ComputeDomains (default: all namespaces).
    #[arg(long, env = "GPU_DRA_CONTROLLER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Who runs the IMEX daemons, as the node plugins were told (`--imex-mode`): with
    /// `host-managed` a domain is Ready once its template exists and gets one channel per claim.
    #[arg(
        long,
        env = "GPU_DRA_IMEX_MODE",
        value_enum,
        default_value = "driver-managed"
    )]
    pub imex_mode: super::run::ImexModeArg,
    /// How often every domain is reconciled even without a change.
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    pub resync_interval: Duration,
}

pub fn run(args: ControllerArgs) -> Result<std::process::ExitCode, CliError> {
    let runtime = crate::node::runtime()?;
    runtime.block_on(async move {
        let client = crate::node::kube_client(args.kubeconfig.as_deref(), &Default::default())
            .await
            .map_err(|e| CliError::Node(Box::new(e)))?;
        let controller = crate::compute_domain::controller::Controller::new(
            client,
            args.namespace.clone(),
            args.imex_mode == super::run::ImexModeArg::HostManaged,
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tracing::info!(namespace = ?args.namespace, "ComputeDomain controller started");
        let task = tokio::spawn(async move {
            controller
                .run(args.resync_interval.max(Duration::from_secs(1)), stopped)
                .await
        });
        super::run::wait_for_signal().await?;
        tracing::info!("shutting down");
        let _ = stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        Ok(std::process::ExitCode::SUCCESS)
    })
}
