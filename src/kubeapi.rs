//! Calls to the API server that always end: every request has a deadline, and a failure says
//! whether and when to retry. A hung API server (accepts, never answers) must not stop
//! publication or garbage collection for good.
pub mod lease;

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Deadlines for calls to the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiTimeouts {
    /// Establishing a connection (TCP and TLS).
    pub connect: Duration,
    /// One request, from sending it to the end of its response.
    pub request: Duration,
}

impl Default for ApiTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(20),
        }
    }
}

impl ApiTimeouts {
    /// Applies the connection deadlines to a client configuration. The read timeout stays off:
    /// it would also cut the slice watch, which is silent for minutes between bookmarks (the
    /// watcher has its own idle timeout); requests are bounded by [`bounded`] instead.
    pub fn apply(&self, config: &mut kube::Config) {
        config.connect_timeout = Some(self.connect);
        config.write_timeout = Some(self.request);
        // kube's built-in retry waits up to 1000 s between 15 attempts, beyond any deadline; the
        // callers retry with their own backoff, which honours the server's Retry-After.
        config.default_retry = false;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no answer from the API server within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

impl CallError {
    /// The HTTP status of an API error.
    pub fn code(&self) -> Option<u16> {
        match self {
            CallError::Kube(kube::Error::Api(status)) => Some(status.code),
            _ => None,
        }
    }

    /// A stale resourceVersion or precondition, or a name taken meanwhile: the caller's view is
    /// behind the server's.
    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// How long the server asked us to wait. kube-rs does not surface response headers on
    /// errors, but the API server also puts Retry-After in the Status body
    /// (`details.retryAfterSeconds`, set for 429 and some 5xx).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Kube(kube::Error::Api(status)) => status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(u64::from(s))),
            _ => None,
        }
    }
}

/// Runs one API call with a deadline.
pub async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(CallError::Kube),
        Err(_) => Err(CallError::Timeout(timeout)),
    }
}

/// Jittered exponential backoff: many nodes that lost the API server together do not come
/// back in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
        }
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// The wait before the next attempt: half the current step plus up to half at random, or
    /// what the server asked for when that is longer.
    pub fn next_wait(&mut self, retry_after: Option<Duration>) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.max);
        let jittered = step / 2 + step.mul_f64(unit_random() / 2.0);
        retry_after.map_or(jittered, |after| after.max(jittered))
    }
}

/// A number in [0, 1) from std's randomly keyed hasher (no RNG dependency for jitter).
fn unit_random() -> f64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Short deadlines for tests against [`hung_api_server`].
#[cfg(test)]
pub(crate) const TEST_TIMEOUTS: ApiTimeouts = ApiTimeouts {
    connect: Duration::from_secs(1),
    request: Duration::from_millis(300),
};

/// An API server that accepts connections and never answers, and a client of it with
/// [`TEST_TIMEOUTS`].
#[cfg(test)]
pub(crate) async fn hung_api_server() -> (kube::Client, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let url = format!("http://127.0.0.1:{port}").parse().expect("url");
    let mut config = kube::Config::new(url);
    TEST_TIMEOUTS.apply(&mut config);
    (kube::Client::try_from(config).expect("client"), server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_honours_retry_after() {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        let waits: Vec<Duration> = (0..6).map(|_| backoff.next_wait(None)).collect();
        for (i, wait) in waits.iter().enumerate() {
            let step =
                (Duration::from_millis(200) * 2u32.pow(i as u32)).min(Duration::from_secs(2));
            assert!(
                *wait >= step / 2 && *wait <= step,
                "{i}: {wait:?} vs {step:?}"
            );
        }
        assert_eq!(
            backoff.next_wait(Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        backoff.reset();
        assert!(backoff.next_wait(None) <= Duration::from_millis(200));
    }

    #[test]
    fn retry_after_and_conflict_come_from_the_status() {
        // As the API server sends it for 429.
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 429, "reason": "TooManyRequests",
            "details": {"retryAfterSeconds": 3},
        }))
        .expect("status");
        let error = CallError::Kube(kube::Error::Api(status.boxed()));
        assert_eq!(error.retry_after(), Some(Duration::from_secs(3)));
        assert!(!error.is_conflict());
        let conflict = CallError::Kube(kube::Error::Api(
            kube::core::Status::failure("stale", "Conflict")
                .with_code(409)
                .boxed(),
        ));
        assert!(conflict.is_conflict());
        assert_eq!(conflict.retry_after(), None);
        assert_eq!(CallError::Timeout(Duration::from_secs(1)).code(), None);
    }
}
