//! One writer among replicas: a `coordination.k8s.io/v1` Lease, as client-go's leader election
//! keeps it. The holder renews it; another replica takes it only once it has seen the same
//! record, unrenewed, for a whole lease duration by its own clock (clocks of different machines
//! are never compared); a holder that cannot renew within the duration stops leading, so two
//! replicas never write at once for longer than a renewal's deadline. A holder that shuts down
//! hands the Lease back (empty holder), so the next one takes over at once.
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// How long a Lease holds without renewal, how often the holder renews, how often the others
/// look (client-go's defaults: 15 s, 10 s deadline, 2 s).
#[derive(Debug, Clone, Copy)]
pub struct LeaseTimes {
    pub duration: Duration,
    pub renew_every: Duration,
    pub retry_every: Duration,
}

impl Default for LeaseTimes {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            retry_every: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("Lease {namespace}/{name}: {reason}")]
    Api {
        namespace: String,
        name: String,
        reason: String,
    },
}

/// A replica's side of one Lease.
pub struct LeaderLease {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    times: LeaseTimes,
    /// The other holder's record as last seen, and when it was first seen so.
    observed: Option<(Option<String>, Option<MicroTime>, Instant)>,
}

impl LeaderLease {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        times: LeaseTimes,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            times,
            observed: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn err(&self, reason: impl std::fmt::Display) -> LeaseError {
        LeaseError::Api {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            reason: reason.to_string(),
        }
    }

    fn spec(&self, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.times.duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to hold the Lease: `true` when this replica holds it now (taken or renewed).
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaseError> {
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.err(e))?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                // Another replica created it first.
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(e) => Err(self.err(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.identity.as_str());
        if !mine && holder.is_some() {
            let record = (holder.clone(), spec.renew_time.clone());
            let seen_since = match &self.observed {
                Some((h, r, at)) if (h, r) == (&record.0, &record.1) => *at,
                _ => {
                    self.observed = Some((record.0, record.1, Instant::now()));
                    Instant::now()
                }
            };
            let duration = spec
                .lease_duration_seconds
                .map_or(
                    self.times.duration,
                    |s| Duration::from_secs(s.max(1) as u64),
                );
            if seen_since.elapsed() < duration {
                return Ok(false);
            }
            tracing::info!(lease = %self.name, expired = ?holder, "the Lease was not renewed for its duration: taking it");
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquired = if mine {
            spec.acquire_time.clone()
        } else {
            None
        };
        lease.spec = Some(self.spec(acquired, transitions));
        // The resourceVersion read above: a replica that wrote meanwhile wins, this one retries.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.observed = None;
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Waits until this replica holds the Lease (or `shutdown` fires: `false`).
    pub async fn acquire(&mut self, shutdown: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        loop {
            // A hung API server must not hold this loop: each attempt has the lease's duration.
            match tokio::time::timeout(self.times.duration, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => return true,
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot take the Lease; retrying"),
                Err(_) => {
                    tracing::warn!(lease = %self.name, "no answer taking the Lease; retrying")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.times.retry_every) => {}
                _ = shutdown.changed() => return false,
            }
        }
    }

    /// Renews the Lease until a renewal has failed for the lease's duration (another replica
    /// may take it from then on), or `shutdown` fires; then returns (`true`: lost).
    pub async fn hold(&mut self, shutdown: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.times.renew_every) => {}
                _ = shutdown.changed() => return false,
            }
            let deadline = self.times.duration.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => renewed = Instant::now(),
                Ok(Ok(false)) => {
                    tracing::error!(lease = %self.name, "another replica holds the Lease now");
                    return true;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew the Lease; retrying"),
                Err(_) => {}
            }
            if renewed.elapsed() >= self.times.duration {
                tracing::error!(lease = %self.name, "the Lease could not be renewed for its duration");
                return true;
            }
        }
    }

    /// Hands the Lease back (empty holder) if this replica holds it, so another one takes it
    /// at once.
    pub async fn release(&mut self) -> Result<(), LeaseError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.err(e))?
        else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        lease.spec = Some(spec);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }
}
