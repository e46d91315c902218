//! The HTTP server behind `--metrics-addr`: `/metrics`, `/healthz`, `/readyz`.
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::Metrics;
use super::auth::{MetricsAuth, Refusal, bearer};

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics endpoint: cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("metrics endpoint on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A bound, not yet serving, metrics listener. Binding is separate so a taken port fails the
/// start before anything is published or registered.
pub struct MetricsServer {
    listener: TcpListener,
    addr: SocketAddr,
    /// Who may read `/metrics` (`None`: anyone who reaches the port).
    auth: Option<Arc<dyn MetricsAuth>>,
}

#[derive(Clone)]
struct Served {
    metrics: Arc<Metrics>,
    auth: Option<Arc<dyn MetricsAuth>>,
}

impl MetricsServer {
    pub async fn bind(addr: SocketAddr) -> Result<Self, MetricsError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| MetricsError::Bind { addr, source })?;
        // The real address, when port 0 asked the kernel to pick one.
        let addr = listener
            .local_addr()
            .map_err(|source| MetricsError::Bind { addr, source })?;
        Ok(Self {
            listener,
            addr,
            auth: None,
        })
    }

    /// Serves `/metrics` only to the callers `auth` lets in; the probes stay open.
    pub fn with_auth(mut self, auth: Arc<dyn MetricsAuth>) -> Self {
        self.auth = Some(auth);
        self
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` becomes true (or its sender is dropped).
    pub async fn serve(
        self,
        metrics: Arc<Metrics>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), MetricsError> {
        let addr = self.addr;
        tracing::info!(%addr, authenticated = self.auth.is_some(), "serving /metrics, /healthz and /readyz");
        let router = Router::new()
            .route("/metrics", get(metrics_text))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(Served {
                metrics,
                auth: self.auth,
            });
        axum::serve(self.listener, router)
            .with_graceful_shutdown(async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
            })
            .await
            .map_err(|source| MetricsError::Serve { addr, source })
    }
}

async fn metrics_text(State(served): State<Served>, headers: axum::http::HeaderMap) -> Response {
    if let Some(auth) = &served.auth {
        let header = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match auth.check(bearer(header)).await {
            Ok(()) => {}
            Err(refusal @ Refusal::Unauthenticated(_)) => {
                return (StatusCode::UNAUTHORIZED, format!("{refusal}\n")).into_response();
            }
            Err(refusal @ Refusal::Forbidden(_)) => {
                return (StatusCode::FORBIDDEN, format!("{refusal}\n")).into_response();
            }
        }
    }
    match served.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response()
        }
    }
}

/// Liveness: the process and its runtime answer. Nothing else, so a slow API server never
/// gets the driver restarted.
async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(served): State<Served>) -> Response {
    let readiness = served.metrics.readiness();
    if readiness.is_ready() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        let body = format!("not ready: {}\n", readiness.missing().join(", "));
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}
