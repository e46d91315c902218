//! The GPU use sampler: how much of each prepared claim's GPU is in use, for the metrics.
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::metrics::Metrics;

/// Reads, every `interval`, how much of each prepared claim's GPU is in use (off the kubelet's
/// path; a GPU that does not answer is skipped this round).
pub(super) fn spawn_usage_sampler(
    control: Arc<dyn crate::gpu::GpuControl>,
    metrics: Arc<Metrics>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => break,
            }
            let minors = metrics.usage_targets();
            if minors.is_empty() && !metrics.has_usage() {
                // No prepared claim and nothing reported: no thread to wake.
                continue;
            }
            let control = control.clone();
            let read = tokio::task::spawn_blocking(move || {
                let mut usage = std::collections::BTreeMap::new();
                for minor in minors {
                    match control.usage(minor) {
                        Ok(u) => {
                            usage.insert(minor, u);
                        }
                        Err(error) => {
                            tracing::debug!(gpu = minor, %error, "cannot read the GPU's use")
                        }
                    }
                }
                // Each process's pod, from its cgroup in the host's /proc (hostPID); a
                // process that ended since, or of no pod, has none.
                let pods: std::collections::BTreeMap<u32, String> = usage
                    .values()
                    .flat_map(|u: &crate::gpu::usage::GpuUsage| &u.processes)
                    .filter_map(|p| {
                        let cgroup =
                            std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid)).ok()?;
                        Some((p.pid, crate::metrics::pod_uid_of_cgroup(&cgroup)?))
                    })
                    .collect();
                (usage, pods)
            })
            .await;
            match read {
                Ok((usage, pods)) => metrics.observe_usage(&usage, &pods),
                Err(error) => tracing::warn!(%error, "the GPU use reader stopped"),
            }
        }
    })
}
