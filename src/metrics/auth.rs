//! Who may read `/metrics` (`--metrics-auth kubernetes`): the series name every tenant's claims
//! and pods on the node, so they are served only to a caller the API server authenticates (a
//! bearer token, through a TokenReview) and authorizes for `get` on the non-resource URL
//! `/metrics` (a SubjectAccessReview), as kube-rbac-proxy and controller-runtime's metrics
//! filter do. Prometheus's service account usually has that already
//! (`nonResourceURLs: ["/metrics"], verbs: ["get"]`). The probes (`/healthz`, `/readyz`) stay
//! open: the kubelet calls them without a token.
//!
//! Answers are kept for a short while per token, so a scrape every few seconds costs the API
//! server two requests a minute, and an API server that does not answer refuses the scrape
//! instead of holding it.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::kubeapi::bounded;

/// Why a request for `/metrics` is refused: 401 (who are you?) or 403 (not you).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    #[error("forbidden: {0}")]
    Forbidden(String),
}

/// Decides whether a bearer token may read `/metrics`.
#[tonic::async_trait]
pub trait MetricsAuth: Send + Sync {
    async fn check(&self, token: Option<&str>) -> Result<(), Refusal>;
}

/// How long an answer is kept for a token (kube-rbac-proxy's default cache is about as long).
const KEEP: Duration = Duration::from_secs(30);
/// How long the API server gets to answer one review.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// The most tokens remembered; past that the oldest answers are forgotten.
const MAX_KEPT: usize = 256;

/// Each token's last answer, and when it was given.
type Kept = HashMap<String, (Instant, Result<(), Refusal>)>;

/// TokenReview and SubjectAccessReview against the cluster's API server.
pub struct KubernetesAuth {
    client: kube::Client,
    kept: Mutex<Kept>,
}

impl KubernetesAuth {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            kept: Mutex::default(),
        }
    }

    async fn review(&self, token: &str) -> Result<(), Refusal> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| {
            Refusal::Unauthenticated(format!("the API server did not answer the {what}: {e}"))
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = bounded(
            REVIEW_TIMEOUT,
            Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review),
        )
        .await
        .map_err(|e| unavailable("TokenReview", &e))?;
        let status = reviewed.status.unwrap_or_default();
        let user = status.user.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(Refusal::Unauthenticated(
                status
                    .error
                    .unwrap_or_else(|| "the token is not valid".into()),
            ));
        }
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let decided = bounded(
            REVIEW_TIMEOUT,
            Api::<SubjectAccessReview>::all(self.client.clone())
                .create(&PostParams::default(), &access),
        )
        .await
        .map_err(|e| unavailable("SubjectAccessReview", &e))?;
        if decided.status.is_some_and(|s| s.allowed) {
            Ok(())
        } else {
            Err(Refusal::Forbidden(format!(
                "{name} may not get /metrics (grant it nonResourceURLs [\"/metrics\"], verbs [\"get\"])"
            )))
        }
    }
}

#[tonic::async_trait]
impl MetricsAuth for KubernetesAuth {
    async fn check(&self, token: Option<&str>) -> Result<(), Refusal> {
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            return Err(Refusal::Unauthenticated(
                "no bearer token (Authorization: Bearer ...)".into(),
            ));
        };
        if let Some((at, answer)) = self.lock().get(token)
            && at.elapsed() < KEEP
        {
            return answer.clone();
        }
        let answer = self.review(token).await;
        let mut kept = self.lock();
        kept.retain(|_, (at, _)| at.elapsed() < KEEP);
        if kept.len() < MAX_KEPT {
            kept.insert(token.to_string(), (Instant::now(), answer.clone()));
        }
        answer
    }
}

impl KubernetesAuth {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The bearer token of an `Authorization` header value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        assert_eq!(bearer(Some("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic dXNlcg==")), None);
        assert_eq!(bearer(Some("abc")), None);
        assert_eq!(bearer(None), None);
    }
}
