//! `--metrics-auth kubernetes` against a real API server: `/metrics` answers 401 without a
//! token or with one the API server does not know, 403 for a service account not allowed
//! `get /metrics`, and the series for one that is (the API server's own TokenReview and
//! SubjectAccessReview decide, RBAC as the cluster has it); the probes answer without a token.
//! The metrics server runs in-process here, as `gpu-dra run` serves it; `e2e/helm.sh` checks
//! that the chart's `metrics.auth=kubernetes` passes the flag and grants the reviews.
//!
//! Needs a control plane (see tests/common/control_plane.rs): ignored by plain `cargo test`,
//! run by e2e/run-tests.
#[path = "common/control_plane.rs"]
mod control_plane;
use control_plane::cluster;
use std::sync::Arc;

use gpu_dra::metrics::auth::KubernetesAuth;
use gpu_dra::metrics::{Metrics, MetricsServer};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAMESPACE: &str = "default";

/// The status line and body of `GET path`, with a bearer token when given.
async fn get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: metrics\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response)
}

async fn token_of(client: &kube::Client, account: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let account_object = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(account.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &account_object)
        .await
        .expect("service account");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(600),
            ..Default::default()
        }),
        ..Default::default()
    };
    accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("token")
        .status
        .and_then(|s| s.token)
        .expect("token")
}

#[tokio::test]
#[ignore = "needs a control plane: GPU_DRA_K8S_BIN or GPU_DRA_TEST_KUBECONFIG (e2e/run-tests sets it and runs ignored tests)"]
async fn only_callers_the_api_server_allows_read_metrics() {
    let (_cluster, config) = cluster().await;
    let client = kube::Client::try_from(config).expect("client");
    let suffix = std::process::id();
    let (reader, stranger) = (
        format!("metrics-reader-{suffix}"),
        format!("stranger-{suffix}"),
    );
    let reader_token = token_of(&client, &reader).await;
    let stranger_token = token_of(&client, &stranger).await;
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    roles
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: ObjectMeta {
                    name: Some(reader.clone()),
                    ..Default::default()
                },
                rules: Some(vec![PolicyRule {
                    non_resource_urls: Some(vec!["/metrics".into()]),
                    verbs: vec!["get".into()],
                    ..Default::default()
                }]),
                ..Default::default()
            },
        )
        .await
        .expect("role");
    bindings
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta {
                    name: Some(reader.clone()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: reader.clone(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: reader.clone(),
                    namespace: Some(NAMESPACE.into()),
                    ..Default::default()
                }]),
            },
        )
        .await
        .expect("binding");

    let server = MetricsServer::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind")
        .with_auth(Arc::new(KubernetesAuth::new(client.clone())));
    let addr = server.local_addr();
    let (_stop, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(server.serve(Arc::new(Metrics::new()), stop));

    let (status, body) = get(addr, "/metrics", None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = get(addr, "/metrics", Some("not-a-token")).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = get(addr, "/metrics", Some(&stranger_token)).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("may not get /metrics"), "{body}");
    assert!(!body.contains("gpu_dra_"), "{body}");
    let (status, body) = get(addr, "/metrics", Some(&reader_token)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("gpu_dra_prepared_claims"), "{body}");
    // Kept answers: the same token again is answered alike.
    assert_eq!(get(addr, "/metrics", Some(&stranger_token)).await.0, 403);
    assert_eq!(
        get(addr, "/healthz", None).await.0,
        200,
        "the probes stay open"
    );

    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    for account in [&reader, &stranger] {
        let _ = accounts.delete(account, &DeleteParams::default()).await;
    }
    let _ = bindings.delete(&reader, &DeleteParams::default()).await;
    let _ = roles.delete(&reader, &DeleteParams::default()).await;
}
