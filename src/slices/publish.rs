//! Publishing the node's pool through the API server, with the semantics of Kubernetes'
//! resourceslice controller: one pool per node owned by the Node, a generation bump whenever the
//! pool changes, obsolete slices deleted before new ones are written, and repair when someone
//! deletes or edits our slices. Nothing is written when the pool is already as desired, so a
//! restart costs no writes.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::watcher;
use tokio::sync::{Mutex, Notify, watch};

use super::SliceOptions;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("Node {node}: {reason}")]
    Node { node: String, reason: String },
    #[error("ResourceSlice {name}: {operation}: {reason}")]
    Slice {
        name: String,
        operation: &'static str,
        reason: String,
    },
    #[error("listing ResourceSlices of node {node}: {reason}")]
    List { node: String, reason: String },
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    pub generation: i64,
}

impl SyncReport {
    pub fn writes(&self) -> usize {
        self.created + self.updated + self.deleted
    }
}

/// Publishes one node's pool and keeps it as desired.
pub struct Publisher {
    client: kube::Client,
    options: SliceOptions,
    node_uid: Mutex<Option<String>>,
    /// Spec we last sent → spec the server stored, per slice name. The server drops fields of
    /// disabled feature gates; comparing against what it kept avoids an endless update loop.
    /// Fingerprints only: full copies of a large pool would cost megabytes of resident memory.
    written: Mutex<BTreeMap<String, (u64, u64)>>,
    wake: Notify,
}

impl Publisher {
    pub fn new(client: kube::Client, options: SliceOptions) -> Arc<Self> {
        Arc::new(Self {
            client,
            options,
            node_uid: Mutex::new(None),
            written: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
        })
    }

    fn api(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    fn selector(&self) -> String {
        format!(
            "spec.driver={},spec.nodeName={}",
            self.options.driver_name, self.options.node_name
        )
    }

    async fn owner(&self) -> Result<OwnerReference, PublishError> {
        let mut cached = self.node_uid.lock().await;
        let uid =
            match cached.as_ref() {
                Some(uid) => uid.clone(),
                None => {
                    let nodes: Api<Node> = Api::all(self.client.clone());
                    let node = nodes.get(&self.options.node_name).await.map_err(|e| {
                        PublishError::Node {
                            node: self.options.node_name.clone(),
                            reason: e.to_string(),
                        }
                    })?;
                    let uid = node.metadata.uid.unwrap_or_default();
                    *cached = Some(uid.clone());
                    uid
                }
            };
        Ok(OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.options.node_name.clone(),
            uid,
            controller: Some(true),
            ..Default::default()
        })
    }

    /// Makes the API server's slices of this pool equal `desired` (as built by
    /// [`super::build`]; names and order are kept, generation and count are set here).
    pub async fn sync(&self, desired: &[ResourceSlice]) -> Result<SyncReport, PublishError> {
        let owner = self.owner().await?;
        let existing = self
            .api()
            .list(&ListParams::default().fields(&self.selector()))
            .await
            .map_err(|e| PublishError::List {
                node: self.options.node_name.clone(),
                reason: e.to_string(),
            })?
            .items;
        let current_generation = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let by_name: BTreeMap<String, &ResourceSlice> = existing
            .iter()
            .filter_map(|s| Some((s.metadata.name.clone()?, s)))
            .collect();

        let written = self.written.lock().await.clone();
        let up_to_date = existing.len() == desired.len()
            && desired.iter().all(|want| {
                let name = want.metadata.name.clone().unwrap_or_default();
                let Some(have) = by_name.get(&name) else {
                    return false;
                };
                let want_spec = spec_json(want, current_generation, desired.len());
                let have_spec = fingerprint(&have.spec);
                let owned = have
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == owner.uid);
                owned
                    && have.spec.pool.generation == current_generation
                    && (have_spec == want_spec
                        || written
                            .get(&name)
                            .is_some_and(|(sent, kept)| *sent == want_spec && *kept == have_spec))
            });
        if up_to_date {
            return Ok(SyncReport {
                generation: current_generation,
                ..Default::default()
            });
        }

        let generation = current_generation.max(self.options.generation - 1) + 1;
        let mut report = SyncReport {
            generation,
            ..Default::default()
        };
        let wanted: Vec<String> = desired
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        // Obsolete slices go first, so the scheduler never sees two versions of a device.
        for slice in &existing {
            let name = slice.metadata.name.clone().unwrap_or_default();
            if wanted.contains(&name) {
                continue;
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: slice.metadata.uid.clone(),
                    resource_version: slice.metadata.resource_version.clone(),
                }),
                ..Default::default()
            };
            match self.api().delete(&name, &params).await {
                Ok(_) => report.deleted += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(slice_err(&name, "delete", e)),
            }
        }
        let mut stored = BTreeMap::new();
        for want in desired {
            let name = want.metadata.name.clone().unwrap_or_default();
            let mut slice = want.clone();
            slice.spec.pool.generation = generation;
            slice.spec.pool.resource_slice_count = desired.len() as i64;
            slice.metadata.owner_references = Some(vec![owner.clone()]);
            let sent = fingerprint(&slice.spec);
            let result = match by_name.get(&name) {
                Some(have) => {
                    slice.metadata.resource_version = have.metadata.resource_version.clone();
                    slice.metadata.labels = have.metadata.labels.clone();
                    report.updated += 1;
                    self.api()
                        .replace(&name, &PostParams::default(), &slice)
                        .await
                        .map_err(|e| slice_err(&name, "update", e))
                }
                None => {
                    report.created += 1;
                    self.api()
                        .create(&PostParams::default(), &slice)
                        .await
                        .map_err(|e| slice_err(&name, "create", e))
                }
            }?;
            stored.insert(name, (sent, fingerprint(&result.spec)));
        }
        *self.written.lock().await = stored;
        Ok(report)
    }

    /// Keeps the pool as `desired` says until `shutdown` fires: syncs at start, whenever our slices
    /// change on the server, as soon as `desired` changes, and every `resync`; retries failures with backoff
    /// (the API server may be away for a while).
    pub async fn run(
        self: Arc<Self>,
        mut desired: watch::Receiver<Arc<Vec<ResourceSlice>>>,
        resync: Duration,
        mut shutdown: watch::Receiver<bool>,
        on_sync: impl Fn(&Result<SyncReport, PublishError>) + Send + Sync + 'static,
    ) {
        let watcher_self = self.clone();
        let events = tokio::spawn(async move {
            let config = watcher::Config::default().fields(&watcher_self.selector());
            let mut stream = watcher(watcher_self.api(), config).boxed();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(
                        watcher::Event::Apply(_)
                        | watcher::Event::Delete(_)
                        | watcher::Event::InitDone,
                    ) => {
                        watcher_self.wake.notify_one();
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "ResourceSlice watch interrupted; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        let mut backoff = Duration::from_millis(250);
        let mut desired_open = true;
        loop {
            // A cheap handle: the pool itself is not copied for each sync.
            let slices = Arc::clone(&desired.borrow_and_update());
            let result = self.sync(&slices).await;
            on_sync(&result);
            let wait = match &result {
                Ok(report) => {
                    backoff = Duration::from_millis(250);
                    if report.writes() > 0 {
                        tracing::info!(
                            created = report.created,
                            updated = report.updated,
                            deleted = report.deleted,
                            generation = report.generation,
                            "ResourceSlices published"
                        );
                    }
                    resync
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "publishing ResourceSlices failed");
                    let wait = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    wait
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified(), if result.is_ok() => {
                    // Let a burst of events (our own writes included) settle into one sync.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                // New devices or a new order (a MIG instance came or went): publish now, so the
                // scheduler does not allocate from a stale pool.
                changed = desired.changed(), if desired_open => desired_open = changed.is_ok(),
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
        events.abort();
    }
}

fn spec_json(slice: &ResourceSlice, generation: i64, count: usize) -> u64 {
    let mut spec = slice.spec.clone();
    spec.pool.generation = generation;
    spec.pool.resource_slice_count = count as i64;
    fingerprint(&spec)
}

/// A hash of the spec's JSON form (maps in it are ordered, so equal specs hash equal).
fn fingerprint(spec: &k8s_openapi::api::resource::v1::ResourceSliceSpec) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(spec)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

fn slice_err(name: &str, operation: &'static str, e: kube::Error) -> PublishError {
    PublishError::Slice {
        name: name.to_string(),
        operation,
        reason: e.to_string(),
    }
}
