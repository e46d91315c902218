//! The Kubernetes client of the node agent (and of the commands that reach the API server).
use super::NodeError;
use crate::kubeapi::ApiTimeouts;

/// Builds a client from `--kubeconfig`, else in-cluster, else `KUBECONFIG`/`~/.kube/config`,
/// with `timeouts` for connecting (requests are bounded by their callers).
pub async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    timeouts: &ApiTimeouts,
) -> Result<kube::Client, NodeError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| NodeError::Kube(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|e| NodeError::Kube(format!("{}: {e}", path.display())))?
        }
        None => match kube::Config::incluster() {
            Ok(config) => config,
            Err(_) => kube::Config::from_kubeconfig(&Default::default())
                .await
                .map_err(|e| {
                    NodeError::Kube(format!("not in a cluster and no usable KUBECONFIG: {e}"))
                })?,
        },
    };
    timeouts.apply(&mut config);
    kube::Client::try_from(config).map_err(|e| NodeError::Kube(e.to_string()))
}
