//! The ComputeDomain controller's leader election (`gpu_dra::kubeapi::lease`) against a real API
//! server: of two replicas one leads; the other takes over only once the leader's Lease went
//! unrenewed for its whole duration (the leader stopped without a word: kill -9), or at once
//! when the leader hands it back at shutdown; a leader that can no longer renew stops leading.
//!
//! Needs a control plane (see tests/common/control_plane.rs): ignored by plain `cargo test`,
//! run by e2e/run-tests. Each test uses a Lease of its own name.
#[path = "common/control_plane.rs"]
mod control_plane;
use control_plane::cluster;
use std::time::{Duration, Instant};

use gpu_dra::kubeapi::lease::{LeaderLease, LeaseTimes};

const NAMESPACE: &str = "default";

/// Short times, so that an expiry takes seconds.
fn times() -> LeaseTimes {
    LeaseTimes {
        duration: Duration::from_secs(3),
        renew_every: Duration::from_millis(500),
        retry_every: Duration::from_millis(200),
    }
}

#[tokio::test]
#[ignore = "needs a control plane: GPU_DRA_K8S_BIN or GPU_DRA_TEST_KUBECONFIG (e2e/run-tests sets it and runs ignored tests)"]
async fn one_replica_leads_and_the_other_takes_over_after_expiry_or_release() {
    let (_cluster, config) = cluster().await;
    let client = kube::Client::try_from(config).expect("client");
    let name = format!("lease-test-{}", std::process::id());
    let mut first = LeaderLease::new(client.clone(), NAMESPACE, &name, "replica-a", times());
    let mut second = LeaderLease::new(client.clone(), NAMESPACE, &name, "replica-b", times());

    assert!(
        first.try_acquire_or_renew().await.expect("a"),
        "the first replica takes the new Lease"
    );
    assert!(
        !second.try_acquire_or_renew().await.expect("b"),
        "the second waits"
    );
    assert!(
        first.try_acquire_or_renew().await.expect("a renews"),
        "the holder renews"
    );

    // The holder stops renewing (kill -9): the other takes it only after a whole duration of
    // seeing the same record, by its own clock.
    let stopped = Instant::now();
    let (_stop, mut shutdown) = tokio::sync::watch::channel(false);
    assert!(
        second.acquire(&mut shutdown).await,
        "the second replica leads at last"
    );
    let waited = stopped.elapsed();
    assert!(
        waited >= times().duration,
        "took over after {waited:?}, before the Lease's duration"
    );
    // The old holder, back, finds the Lease taken: it must not lead.
    assert!(!first.try_acquire_or_renew().await.expect("a again"));

    // A holder shutting down hands it back: the other takes it at once (its next try).
    second.release().await.expect("release");
    assert!(
        first.try_acquire_or_renew().await.expect("a after release"),
        "a released Lease is free at once"
    );
    first.release().await.expect("release");

    // A leader whose renewals fail for the Lease's duration (here: the Lease is deleted and
    // taken by another replica meanwhile) stops leading.
    let mut third = LeaderLease::new(client.clone(), NAMESPACE, &name, "replica-c", times());
    assert!(third.try_acquire_or_renew().await.expect("c"));
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), NAMESPACE);
    api.delete(&name, &Default::default())
        .await
        .expect("delete the Lease");
    let mut fourth = LeaderLease::new(client, NAMESPACE, &name, "replica-d", times());
    assert!(
        fourth.try_acquire_or_renew().await.expect("d"),
        "d takes the re-created Lease"
    );
    let lost = tokio::time::timeout(Duration::from_secs(30), third.hold(&mut shutdown))
        .await
        .expect("hold ended");
    assert!(
        lost,
        "the replica whose Lease another one holds stops leading"
    );
    api.delete(&name, &Default::default())
        .await
        .expect("clean up");
}
