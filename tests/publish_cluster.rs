//! The ResourceSlice publisher against a real API server, with its API calls counted on the wire
//! (a tower layer under the kube client): a steady sync costs no call, a change only its writes.
//!
//! Needs a control plane: GPU_DRA_TEST_KUBECONFIG names a running one (e.g. from
//! `e2e/cluster up`), else GPU_DRA_K8S_BIN lets the test start its own; skipped without either,
//! and is ignored by plain `cargo test` (e2e/run-tests runs it). It creates its own Node (a unique name) and
//! removes it and its slices at the end.
#[path = "common/control_plane.rs"]
mod control_plane;
use control_plane::cluster;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use gpu_dra::gpu::sim::SimNode;
use gpu_dra::slices::publish::{PublishError, Publisher, SyncReport};
use gpu_dra::slices::{self, SliceOptions};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tokio::sync::watch;

const DRIVER: &str = "gpu.nvidia.com";

/// Every request the client sends: method and path with query.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<(http::Method, String)>>>);

#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    lists: usize,
    watches: usize,
    node_gets: usize,
    creates: usize,
    updates: usize,
    deletes: usize,
    other: usize,
}

impl Counts {
    fn writes(&self) -> usize {
        self.creates + self.updates + self.deletes
    }
}

impl Calls {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(http::Method, String)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts the calls since `from` (an index from [`Self::mark`]).
    fn since(&self, from: usize) -> Counts {
        let mut counts = Counts::default();
        for (method, uri) in self.lock()[from..].iter() {
            let path = uri.split('?').next().unwrap_or_default();
            let collection = path.ends_with("/resourceslices");
            match method.as_str() {
                "GET" if uri.contains("watch=true") => counts.watches += 1,
                "GET" if collection => counts.lists += 1,
                "GET" if path.starts_with("/api/v1/nodes/") => counts.node_gets += 1,
                "POST" if collection => counts.creates += 1,
                "PUT" => counts.updates += 1,
                "DELETE" => counts.deletes += 1,
                _ => counts.other += 1,
            }
        }
        counts
    }

    fn mark(&self) -> usize {
        self.lock().len()
    }
}

impl<S> tower::Layer<S> for Calls {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            calls: self.clone(),
        }
    }
}

#[derive(Clone)]
struct Counted<S> {
    inner: S,
    calls: Calls,
}

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let uri = request
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default();
        self.calls.lock().push((request.method().clone(), uri));
        self.inner.call(request)
    }
}

fn desired(node: &str, gpus: &str) -> Vec<ResourceSlice> {
    let sim = SimNode::new(gpus.parse().expect("spec"), node, None);
    let inventory = sim.inventory().expect("inventory");
    slices::build(&inventory, &SliceOptions::new(DRIVER, node)).expect("slices")
}

async fn create_node(nodes: &Api<Node>, name: &str) -> String {
    let mut node = Node::default();
    node.metadata.name = Some(name.into());
    let node = nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create Node");
    node.metadata.uid.expect("uid")
}

async fn our_slices(admin: &Api<ResourceSlice>, node: &str) -> Vec<ResourceSlice> {
    admin
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("list")
        .items
}

async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> F,
) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a control plane: GPU_DRA_K8S_BIN or GPU_DRA_TEST_KUBECONFIG (e2e/run-tests sets it and runs ignored tests)"]
async fn publisher_api_calls_per_sync() {
    let (_cluster, config) = cluster().await;
    let admin = kube::Client::try_from(config.clone()).expect("admin client");
    let calls = Calls::default();
    let counted = kube::client::ClientBuilder::try_from(config)
        .expect("builder")
        .with_layer(&calls)
        .build();
    let node = format!("publish-test-{}", std::process::id());
    let nodes: Api<Node> = Api::all(admin.clone());
    let slices_api: Api<ResourceSlice> = Api::all(admin.clone());
    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    let first_uid = create_node(&nodes, &node).await;

    let publisher = Publisher::new(
        counted,
        SliceOptions::new(DRIVER, &node),
        Duration::from_secs(5),
    );
    // First sync: the watch's list, the Node's UID, and one create per slice.
    let pool = desired(&node, "1xH100-SXM5-80GB");
    let report = publisher.sync(&pool).await.expect("first sync");
    let first = calls.since(0);
    eprintln!("first sync: {report:?}; calls {first:?}");
    assert_eq!(report.created, pool.len());
    assert_eq!(
        (
            first.lists,
            first.node_gets,
            first.creates,
            first.updates,
            first.deletes
        ),
        (1, 1, pool.len(), 0, 0)
    );

    // Steady state: nothing to write, and nothing read either (the watch has it all).
    let mark = calls.mark();
    for _ in 0..5 {
        let report = publisher.sync(&pool).await.expect("steady sync");
        assert_eq!(report.writes(), 0);
    }
    let steady = calls.since(mark);
    eprintln!("5 steady syncs: calls {steady:?}");
    assert_eq!(
        steady.writes() + steady.lists + steady.node_gets + steady.other,
        0
    );

    // The running loop: resyncs cost nothing.
    let (desired_tx, desired_rx) = watch::channel(Arc::new(pool.clone()));
    let results: Arc<Mutex<Vec<(Instant, SyncReport)>>> = Arc::default();
    let start_loop = |resync: Duration| {
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let seen = results.clone();
        let run = tokio::spawn(publisher.clone().run(
            desired_rx.clone(),
            resync,
            shutdown_rx,
            move |result: &Result<SyncReport, PublishError>| {
                match result {
                    Ok(report) => seen
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((Instant::now(), report.clone())),
                    Err(e) => eprintln!("sync failed: {e}"),
                }
            },
        ));
        (shutdown_tx, run)
    };
    let stop_loop = |(shutdown_tx, run): (watch::Sender<bool>, tokio::task::JoinHandle<()>)| async move {
        shutdown_tx.send_replace(true);
        tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("the loop stops")
            .expect("no panic");
    };
    let resyncing = start_loop(Duration::from_millis(200));
    wait_until("five loop syncs", Duration::from_secs(60), || {
        let n = results.lock().unwrap_or_else(|p| p.into_inner()).len();
        async move { n >= 5 }
    })
    .await;
    stop_loop(resyncing).await;
    let resyncs = results.lock().unwrap_or_else(|p| p.into_inner()).len();
    let idle = calls.since(mark);
    eprintln!("{resyncs} loop syncs: calls {idle:?}");
    assert_eq!(idle.writes() + idle.lists + idle.node_gets + idle.other, 0);

    // A desired change is written at once: with resyncs an hour apart, nothing else could write
    // it. The loop's first sync (at start) is done before the change is sent.
    let loop_running = start_loop(Duration::from_secs(3600));
    wait_until("the loop's first sync", Duration::from_secs(60), || {
        let n = results.lock().unwrap_or_else(|p| p.into_inner()).len();
        async move { n > resyncs }
    })
    .await;
    let mark = calls.mark();
    let bigger = desired(&node, "2xH100-SXM5-80GB");
    let sent = Instant::now();
    desired_tx.send_replace(Arc::new(bigger.clone()));
    let published = wait_until("the new pool published", Duration::from_secs(60), || {
        let results = results.clone();
        async move {
            results
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|(at, report)| *at > sent && report.writes() > 0)
        }
    })
    .await;
    // Calls the publish may still make (none are expected) have time to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let change = calls.since(mark);
    let new_slices = bigger.len().saturating_sub(pool.len());
    eprintln!(
        "desired change ({} → {} slices) published in {published:?}: calls {change:?}",
        pool.len(),
        bigger.len()
    );
    assert_eq!(change.lists + change.other, 0);
    assert_eq!(change.creates, new_slices);
    assert_eq!(change.updates, pool.len().min(bigger.len()));
    assert_eq!(change.deletes, 0);
    // A Node GET only when slices are created (their owner may have been re-created).
    assert_eq!(change.node_gets, usize::from(new_slices > 0));

    // The Node is re-created and the garbage collector removes the old owner's slices: the
    // publisher re-reads the UID and publishes slices owned by the new Node (seen through its
    // watch: the loop's resyncs are an hour apart).
    let mark = calls.mark();
    nodes
        .delete(&node, &DeleteParams::default())
        .await
        .expect("delete Node");
    let second_uid = create_node(&nodes, &node).await;
    assert_ne!(first_uid, second_uid);
    slices_api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields(&format!("spec.nodeName={node}")),
        )
        .await
        .expect("delete slices as the GC would");
    let repaired = wait_until(
        "slices owned by the new Node",
        Duration::from_secs(10),
        || {
            let (slices_api, node, uid, count) = (
                slices_api.clone(),
                node.clone(),
                second_uid.clone(),
                bigger.len(),
            );
            async move {
                let slices = our_slices(&slices_api, &node).await;
                slices.len() == count
                    && slices.iter().all(|s| {
                        s.metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|o| o.uid == uid)
                    })
            }
        },
    )
    .await;
    let recreate = calls.since(mark);
    eprintln!("re-created Node: slices back in {repaired:?}; calls {recreate:?}");
    // Deletions may reach the watch in two bursts: then a second repair (and UID check) follows.
    assert!((1..=2).contains(&recreate.node_gets), "{recreate:?}");
    assert!(recreate.creates >= bigger.len(), "{recreate:?}");
    assert_eq!(recreate.lists, 0);

    stop_loop(loop_running).await;
    let _ = slices_api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields(&format!("spec.nodeName={node}")),
        )
        .await;
    let _ = nodes.delete(&node, &DeleteParams::default()).await;
}
