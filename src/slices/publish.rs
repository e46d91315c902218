//! Publishing the node's pool through the API server, with the semantics of Kubernetes'
//! resourceslice controller: one pool per node owned by the Node, a generation bump whenever the
//! pool changes, obsolete slices deleted before new ones are written, and repair when someone
//! deletes or edits our slices. Nothing is written when the pool is already as desired, so a
//! restart costs no writes; the comparison is with the watched slices, so a sync that finds
//! nothing to do costs no API call either.
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::watcher;
use tokio::sync::{Mutex, Notify, watch};

use super::SliceOptions;
use crate::kubeapi::{Backoff, CallError, bounded};

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("Node {node}: {reason}")]
    Node {
        node: String,
        reason: String,
        retry: Retry,
    },
    #[error("ResourceSlice {name}: {operation}: {reason}")]
    Slice {
        name: String,
        operation: &'static str,
        reason: String,
        retry: Retry,
    },
    #[error("listing ResourceSlices of node {node}: {reason}")]
    List { node: String, reason: String },
}

/// How a failed sync should be retried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Retry {
    /// With exponential backoff.
    #[default]
    Backoff,
    /// Not before the server's Retry-After.
    After(Duration),
    /// Our view of the pool was stale (409): again as soon as the watch catches up.
    Conflict,
}

impl Retry {
    fn of(error: &CallError) -> Self {
        if error.is_conflict() {
            Retry::Conflict
        } else {
            error.retry_after().map_or(Retry::Backoff, Retry::After)
        }
    }
}

impl PublishError {
    pub fn retry(&self) -> Retry {
        match self {
            PublishError::Node { retry, .. } | PublishError::Slice { retry, .. } => *retry,
            PublishError::List { .. } => Retry::Backoff,
        }
    }
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

/// What a sync needs to know of one of our slices on the server. Fingerprints, not copies: the
/// full pool would cost megabytes of resident memory on every GPU node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    uid: Option<String>,
    resource_version: Option<String>,
    generation: i64,
    owners: Vec<String>,
    spec: u64,
    labels: Option<BTreeMap<String, String>>,
}

impl Stored {
    fn of(slice: &ResourceSlice) -> Self {
        Self {
            uid: slice.metadata.uid.clone(),
            resource_version: slice.metadata.resource_version.clone(),
            generation: slice.spec.pool.generation,
            owners: slice
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|o| o.uid.clone())
                .collect(),
            spec: fingerprint(&slice.spec),
            labels: slice.metadata.labels.clone(),
        }
    }

    /// Whether `self` is an older version of the same object than `other` (resourceVersions are
    /// etcd revisions in practice; when they do not parse, the newcomer wins).
    fn older_than(&self, other: &Stored) -> bool {
        let revision = |s: &Stored| s.resource_version.as_deref()?.parse::<u64>().ok();
        match (revision(self), revision(other)) {
            (Some(mine), Some(theirs)) if self.uid == other.uid => mine < theirs,
            _ => true,
        }
    }
}

#[derive(Default)]
struct StoreState {
    slices: BTreeMap<String, Stored>,
    /// A (re)list in progress: replaces `slices` when complete.
    relisting: Option<BTreeMap<String, Stored>>,
    listed: bool,
    last_error: Option<String>,
}

/// The node's slices as the watch (and our own writes) last saw them: what a sync compares
/// against, so an unchanged pool costs no API call at all.
#[derive(Default)]
struct SliceStore {
    state: std::sync::Mutex<StoreState>,
    changed: Notify,
    listed: Notify,
}

impl SliceStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, StoreState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn snapshot(&self) -> Option<BTreeMap<String, Stored>> {
        let state = self.lock();
        state.listed.then(|| state.slices.clone())
    }

    fn apply(&self, event: watcher::Event<ResourceSlice>) {
        {
            let mut state = self.lock();
            state.last_error = None;
            match event {
                watcher::Event::Init => state.relisting = Some(BTreeMap::new()),
                watcher::Event::InitApply(slice) => {
                    if let (Some(relisting), Some(name)) =
                        (state.relisting.as_mut(), slice.metadata.name.clone())
                    {
                        relisting.insert(name, Stored::of(&slice));
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(listed) = state.relisting.take() {
                        state.slices = listed;
                    }
                    state.listed = true;
                    self.listed.notify_waiters();
                }
                watcher::Event::Apply(slice) => state.record(&slice),
                watcher::Event::Delete(slice) => state.forget(
                    slice.metadata.name.as_deref().unwrap_or_default(),
                    slice.metadata.uid.as_deref(),
                ),
            }
        }
        self.changed.notify_one();
    }

    fn failed(&self, error: String) {
        self.lock().last_error = Some(error);
    }
}

impl StoreState {
    /// Keeps the newest version seen, from the watch or from a write's response.
    fn record(&mut self, slice: &ResourceSlice) {
        let Some(name) = slice.metadata.name.as_ref() else {
            return;
        };
        let new = Stored::of(slice);
        for map in std::iter::once(&mut self.slices).chain(self.relisting.as_mut()) {
            if map.get(name).is_none_or(|have| have.older_than(&new)) {
                map.insert(name.clone(), new.clone());
            }
        }
    }

    /// Drops a deleted slice, unless the name already belongs to a newer object.
    fn forget(&mut self, name: &str, uid: Option<&str>) {
        for map in std::iter::once(&mut self.slices).chain(self.relisting.as_mut()) {
            if map
                .get(name)
                .is_some_and(|have| uid.is_none() || have.uid.as_deref() == uid)
            {
                map.remove(name);
            }
        }
    }
}

/// Aborts the watch task with the publisher that started it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Consecutive 409s retried quietly before they count as failures.
const QUIET_CONFLICTS: u32 = 3;

/// Publishes one node's pool and keeps it as desired.
pub struct Publisher {
    client: kube::Client,
    options: SliceOptions,
    /// Deadline of each API call (and of the watch's first list).
    timeout: Duration,
    node_uid: Mutex<Option<String>>,
    /// Spec we last sent → spec the server stored, per slice name. The server drops fields of
    /// disabled feature gates; comparing against what it kept avoids an endless update loop.
    written: Mutex<BTreeMap<String, (u64, u64)>>,
    store: Arc<SliceStore>,
    watch: OnceLock<AbortOnDrop>,
}

impl Publisher {
    pub fn new(client: kube::Client, options: SliceOptions, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            client,
            options,
            timeout,
            node_uid: Mutex::new(None),
            written: Mutex::new(BTreeMap::new()),
            store: Arc::new(SliceStore::default()),
            watch: OnceLock::new(),
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

    /// Starts feeding the store from a watch of the node's slices (once per publisher): its
    /// initial list is the only list the publisher makes.
    fn ensure_watch(&self) {
        self.watch.get_or_init(|| {
            let store = self.store.clone();
            let stream = watcher(
                self.api(),
                watcher::Config::default().fields(&self.selector()),
            );
            let node = self.options.node_name.clone();
            AbortOnDrop(tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                // Our own backoff rather than kube's default: an expired resourceVersion (410,
                // e.g. after the API server restarted) must relist at once, not after the
                // backoff the outage built up, or deletions go unnoticed for that long.
                let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
                let mut failing = false;
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(event) => {
                            if std::mem::take(&mut failing) {
                                tracing::info!(node = %node, "ResourceSlice watch resumed");
                            }
                            backoff.reset();
                            store.apply(event);
                        }
                        Err(error) => {
                            store.failed(error.to_string());
                            let status = watch_status(&error);
                            if status == Some(410) {
                                tracing::debug!(node = %node, %error, "ResourceSlice watch expired; listing again");
                                continue;
                            }
                            failing = true;
                            let wait = backoff.next_wait(None);
                            if matches!(status, Some(401 | 403)) {
                                tracing::error!(node = %node, %error, retry_in = ?wait, "ResourceSlice watch refused: the driver needs list and watch on resourceslices");
                            } else {
                                tracing::warn!(node = %node, %error, retry_in = ?wait, "ResourceSlice watch failed");
                            }
                            tokio::time::sleep(wait).await;
                        }
                    }
                }
            }))
        });
    }

    /// The store once the watch has listed the slices, or an error after the deadline.
    async fn listed(&self) -> Result<BTreeMap<String, Stored>, PublishError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let notified = self.store.listed.notified();
            if let Some(slices) = self.store.snapshot() {
                return Ok(slices);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let last = self.store.lock().last_error.clone();
                return Err(PublishError::List {
                    node: self.options.node_name.clone(),
                    reason: format!(
                        "the watch has not listed them within {:?}{}",
                        self.timeout,
                        last.map(|e| format!(": {e}")).unwrap_or_default()
                    ),
                });
            }
        }
    }

    /// The Node as owner. Its UID is cached, and read again when `refresh` is set: a re-created
    /// Node has a new UID, and slices owned by the old one are garbage-collected.
    async fn owner(&self, refresh: bool) -> Result<OwnerReference, PublishError> {
        let mut cached = self.node_uid.lock().await;
        let uid = match cached.as_ref() {
            Some(uid) if !refresh => uid.clone(),
            _ => {
                let nodes: Api<Node> = Api::all(self.client.clone());
                let node = bounded(self.timeout, nodes.get(&self.options.node_name))
                    .await
                    .map_err(|e| PublishError::Node {
                        node: self.options.node_name.clone(),
                        reason: e.to_string(),
                        retry: Retry::of(&e),
                    })?;
                let uid = node.metadata.uid.unwrap_or_default();
                if let Some(old) = cached.as_ref().filter(|old| **old != uid) {
                    tracing::info!(node = %self.options.node_name, old_uid = %old, uid = %uid, "the Node was re-created; its slices follow the new UID");
                }
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
    /// [`super::build`]; names and order are kept, generation and count are set here). Compares
    /// with the watched slices: when nothing differs, no API call is made.
    pub async fn sync(&self, desired: &[ResourceSlice]) -> Result<SyncReport, PublishError> {
        self.ensure_watch();
        let existing = self.listed().await?;
        // A slice missing may have been garbage-collected because the Node was re-created:
        // check its UID before writing new ones.
        let refresh = desired.iter().any(|want| {
            want.metadata
                .name
                .as_ref()
                .is_none_or(|name| !existing.contains_key(name))
        });
        let owner = self.owner(refresh).await?;
        let current_generation = existing.values().map(|s| s.generation).max().unwrap_or(0);

        let written = self.written.lock().await.clone();
        let up_to_date = existing.len() == desired.len()
            && desired.iter().all(|want| {
                let name = want.metadata.name.clone().unwrap_or_default();
                let Some(have) = existing.get(&name) else {
                    return false;
                };
                let want_spec = spec_json(want, current_generation, desired.len());
                have.owners.contains(&owner.uid)
                    && have.generation == current_generation
                    && (have.spec == want_spec
                        || written
                            .get(&name)
                            .is_some_and(|(sent, kept)| *sent == want_spec && *kept == have.spec))
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
        for (name, slice) in &existing {
            if wanted.contains(name) {
                continue;
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: slice.uid.clone(),
                    resource_version: slice.resource_version.clone(),
                }),
                ..Default::default()
            };
            match bounded(self.timeout, self.api().delete(name, &params)).await {
                Ok(_) => report.deleted += 1,
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(slice_err(name, "delete", e)),
            }
            self.store.lock().forget(name, slice.uid.as_deref());
        }
        let mut stored = BTreeMap::new();
        for want in desired {
            let name = want.metadata.name.clone().unwrap_or_default();
            let mut slice = want.clone();
            slice.spec.pool.generation = generation;
            slice.spec.pool.resource_slice_count = desired.len() as i64;
            slice.metadata.owner_references = Some(vec![owner.clone()]);
            let sent = fingerprint(&slice.spec);
            let result = match existing.get(&name) {
                Some(have) => {
                    slice.metadata.resource_version = have.resource_version.clone();
                    slice.metadata.labels = have.labels.clone();
                    let result = bounded(
                        self.timeout,
                        self.api().replace(&name, &PostParams::default(), &slice),
                    )
                    .await
                    .map_err(|e| slice_err(&name, "update", e))?;
                    report.updated += 1;
                    result
                }
                None => {
                    let result = bounded(
                        self.timeout,
                        self.api().create(&PostParams::default(), &slice),
                    )
                    .await
                    .map_err(|e| slice_err(&name, "create", e))?;
                    report.created += 1;
                    result
                }
            };
            // The watch will say the same, later: a sync meanwhile must not see the old version.
            self.store.lock().record(&result);
            stored.insert(name, (sent, fingerprint(&result.spec)));
        }
        *self.written.lock().await = stored;
        Ok(report)
    }

    /// Keeps the pool as `desired` says until `shutdown` fires: syncs at start, whenever our slices
    /// change on the server, as soon as `desired` changes, and every `resync`; retries failures
    /// with jittered backoff (the API server may be away for a while), not before a Retry-After,
    /// and a stale view (409) as soon as the watch brings the newer version.
    pub async fn run(
        self: Arc<Self>,
        mut desired: watch::Receiver<Arc<Vec<ResourceSlice>>>,
        resync: Duration,
        mut shutdown: watch::Receiver<bool>,
        on_sync: impl Fn(&Result<SyncReport, PublishError>) + Send + Sync + 'static,
    ) {
        self.ensure_watch();
        let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
        let mut conflicts = 0;
        let mut desired_open = true;
        loop {
            // A cheap handle: the pool itself is not copied for each sync.
            let slices = Arc::clone(&desired.borrow_and_update());
            // A sync may wait up to the API timeout per call: shutdown must not wait for it.
            let result = tokio::select! {
                result = self.sync(&slices) => result,
                _ = shutdown.changed() => break,
            };
            on_sync(&result);
            let (wait, on_change) = match &result {
                Ok(report) => {
                    backoff.reset();
                    conflicts = 0;
                    if report.writes() > 0 {
                        tracing::info!(
                            created = report.created,
                            updated = report.updated,
                            deleted = report.deleted,
                            generation = report.generation,
                            "ResourceSlices published"
                        );
                    }
                    (resync, true)
                }
                Err(e) if e.retry() == Retry::Conflict && conflicts < QUIET_CONFLICTS => {
                    conflicts += 1;
                    tracing::debug!(error = %e, "ResourceSlices changed meanwhile; syncing again");
                    (Duration::from_secs(1), true)
                }
                Err(e) => {
                    let retry_after = match e.retry() {
                        Retry::After(after) => Some(after),
                        _ => None,
                    };
                    let wait = backoff.next_wait(retry_after);
                    tracing::warn!(error = %e, retry_in = ?wait, "publishing ResourceSlices failed");
                    (wait, false)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.store.changed.notified(), if on_change => {
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
    }
}

/// The HTTP status of a watch failure, when the API server answered.
fn watch_status(error: &watcher::Error) -> Option<u16> {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
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

fn slice_err(name: &str, operation: &'static str, e: CallError) -> PublishError {
    PublishError::Slice {
        name: name.to_string(),
        operation,
        reason: e.to_string(),
        // An update of a slice deleted meanwhile: the watch will tell, then we create it.
        retry: if operation == "update" && e.is_not_found() {
            Retry::Conflict
        } else {
            Retry::of(&e)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubeapi::{TEST_TIMEOUTS, hung_api_server};

    fn slice(name: &str, uid: &str, resource_version: &str) -> ResourceSlice {
        let mut slice = ResourceSlice::default();
        slice.metadata.name = Some(name.into());
        slice.metadata.uid = Some(uid.into());
        slice.metadata.resource_version = Some(resource_version.into());
        slice
    }

    #[test]
    fn the_store_keeps_the_newest_version_and_the_newest_object() {
        let store = SliceStore::default();
        assert!(store.snapshot().is_none(), "not listed yet");
        store.apply(watcher::Event::Init);
        store.apply(watcher::Event::InitApply(slice("a", "u1", "10")));
        assert!(store.snapshot().is_none(), "list incomplete");
        store.apply(watcher::Event::InitDone);
        // Our write's response (rv 12) arrives before the watch's event of an older write.
        store.lock().record(&slice("a", "u1", "12"));
        store.apply(watcher::Event::Apply(slice("a", "u1", "11")));
        let a = |s: &SliceStore| s.snapshot().expect("listed")["a"].clone();
        assert_eq!(a(&store).resource_version.as_deref(), Some("12"));
        // Deleted and re-created under the same name: the old object's deletion is not ours.
        store.lock().record(&slice("a", "u2", "20"));
        store.apply(watcher::Event::Delete(slice("a", "u1", "13")));
        assert_eq!(a(&store).uid.as_deref(), Some("u2"));
        store.apply(watcher::Event::Delete(slice("a", "u2", "21")));
        assert!(store.snapshot().expect("listed").is_empty());
        // A relist replaces everything when complete; writes meanwhile land in both views.
        store.apply(watcher::Event::Apply(slice("b", "u3", "30")));
        store.apply(watcher::Event::Init);
        store.lock().record(&slice("c", "u4", "31"));
        store.apply(watcher::Event::InitDone);
        let names: Vec<String> = store.snapshot().expect("listed").into_keys().collect();
        assert_eq!(names, ["c"]);
    }

    #[test]
    fn the_fingerprint_sees_every_spec_change_and_only_those() {
        let built = crate::slices::build(
            &crate::gpu::sim::SimNode::new("sim:2xT4".parse().expect("spec"), "n1", None)
                .inventory()
                .expect("inventory"),
            &SliceOptions::new("gpu.nvidia.com", "n1"),
        )
        .expect("slices");
        let slice = &built[0];
        let same = spec_json(slice, slice.spec.pool.generation, 1);
        assert_eq!(
            same,
            spec_json(&slice.clone(), slice.spec.pool.generation, 1)
        );
        // A new generation or slice count is a change the server must see...
        assert_ne!(same, spec_json(slice, slice.spec.pool.generation + 1, 1));
        assert_ne!(same, spec_json(slice, slice.spec.pool.generation, 2));
        // ...and so is any device change; metadata is not part of the spec.
        let mut renamed = slice.clone();
        renamed.spec.devices.get_or_insert_with(Vec::new)[0].name = "gpu-9".into();
        assert_ne!(same, spec_json(&renamed, slice.spec.pool.generation, 1));
        let mut relabelled = slice.clone();
        relabelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert_eq!(same, spec_json(&relabelled, slice.spec.pool.generation, 1));
    }

    #[test]
    fn unparsable_resource_versions_let_the_newcomer_win() {
        let old = Stored::of(&slice("a", "u1", "not-a-number"));
        let new = Stored::of(&slice("a", "u1", "5"));
        assert!(old.older_than(&new) && new.older_than(&old));
        let v5 = Stored::of(&slice("a", "u1", "5"));
        let v7 = Stored::of(&slice("a", "u1", "7"));
        assert!(v5.older_than(&v7) && !v7.older_than(&v5));
    }

    #[tokio::test]
    async fn a_sync_against_a_hung_api_server_fails_within_the_deadline() {
        let (client, server) = hung_api_server().await;
        let publisher = Publisher::new(
            client,
            SliceOptions::new("gpu.nvidia.com", "n1"),
            TEST_TIMEOUTS.request,
        );
        let started = std::time::Instant::now();
        let error = publisher.sync(&[]).await.expect_err("no answer");
        assert!(matches!(error, PublishError::List { .. }), "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        server.abort();
    }
}
