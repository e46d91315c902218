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
    /// Where each domain's IMEX credentials are kept (Secrets `gpu-dra-imex-<domain UID>`; the
    /// node plugins read them there; default: this process's own namespace).
    #[arg(long, env = "GPU_DRA_IMEX_CREDENTIALS_NAMESPACE")]
    pub imex_credentials_namespace: Option<String>,
    /// How often every domain is reconciled even without a change.
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    pub resync_interval: Duration,
    /// Where the Lease that picks the one replica writing is (the chart: its release's
    /// namespace). Without it the controller runs unelected: only one may run.
    #[arg(long, env = "GPU_DRA_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// This replica's name in the Lease (the chart: its pod's name; default: host name and PID).
    #[arg(long, env = "GPU_DRA_LEADER_ELECTION_IDENTITY")]
    pub leader_election_identity: Option<String>,
}

/// The Lease replicas of the controller elect their one writer with.
pub const LEASE_NAME: &str = "gpu-dra-compute-domain-controller";

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    format!("{host}_{}", std::process::id())
}

pub fn run(args: ControllerArgs) -> Result<std::process::ExitCode, CliError> {
    let runtime = crate::node::runtime()?;
    runtime.block_on(async move {
        let client = crate::node::kube_client(args.kubeconfig.as_deref(), &Default::default())
            .await
            .map_err(|e| CliError::Node(Box::new(e)))?;
        let controller = crate::compute_domain::controller::Controller::new(
            client.clone(),
            args.namespace.clone(),
            args.imex_mode == super::run::ImexModeArg::HostManaged,
            args.imex_credentials_namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string()),
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let resync = args.resync_interval.max(Duration::from_secs(1));
        let mut lease = args.leader_election_namespace.as_deref().map(|namespace| {
            crate::kubeapi::lease::LeaderLease::new(
                client.clone(),
                namespace,
                LEASE_NAME,
                &args
                    .leader_election_identity
                    .clone()
                    .unwrap_or_else(default_identity),
                Default::default(),
            )
        });
        let mut elected = stopped.clone();
        let mut task = tokio::spawn(async move {
            let Some(lease) = lease.as_mut() else {
                tracing::info!(namespace = ?args.namespace, "ComputeDomain controller started (no leader election)");
                controller.run(resync, stopped).await;
                return false;
            };
            tracing::info!(identity = lease.identity(), "waiting to lead (Lease {LEASE_NAME})");
            if !lease.acquire(&mut elected).await {
                return false;
            }
            tracing::info!(namespace = ?args.namespace, identity = lease.identity(), "ComputeDomain controller started: leading");
            // The controller stops when the Lease is lost (another replica writes from then on)
            // or at shutdown; the process then exits, as client-go's controllers do.
            let (lost_tx, lost_rx) = tokio::sync::watch::channel(false);
            let mut shutdown = stopped.clone();
            let run = controller.run(resync, lost_rx);
            tokio::pin!(run);
            let lost = tokio::select! {
                lost = lease.hold(&mut shutdown) => lost,
                () = &mut run => false,
            };
            let _ = lost_tx.send(true);
            run.await;
            if !lost && let Err(e) = lease.release().await {
                tracing::warn!(error = %e, "cannot hand the Lease back");
            }
            lost
        });
        tokio::select! {
            signal = super::run::wait_for_signal() => {
                signal?;
                tracing::info!("shutting down");
                let _ = stop.send(true);
                let _ = tokio::time::timeout(Duration::from_secs(5), &mut task).await;
                Ok(std::process::ExitCode::SUCCESS)
            }
            lost = &mut task => {
                if lost.unwrap_or(true) {
                    tracing::error!("leadership lost: exiting so that the replica restarts and waits its turn");
                    return Ok(std::process::ExitCode::FAILURE);
                }
                Ok(std::process::ExitCode::SUCCESS)
            }
        }
    })
}
