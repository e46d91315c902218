//! The [`NodeDriver`] kubelet talks to: fetches claims, prepares each on a blocking thread (claims
//! on different GPUs side by side, see [`DeviceState`]), and reports prepared devices in the
//! claims' status once the node's state has changed, outside every lock. Nothing here serializes
//! calls: kubelet's calls for different pods run side by side, kept apart only by the claims and
//! GPUs they hold, and by the node lock while another driver instance runs (a rolling update).
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::PrepareError;

use super::claims::ClaimSource;
use super::in_flight::{Entry, InFlight, Outcome};
use super::lock::{NodeLock, NodeLockGuard, Others, Presence};
use super::state::DeviceState;
use super::{ClaimRef, NodeDriver, PrepareResult, UnprepareResult};

// Re-exported: the metrics observer names it beside `DriverObserver`; it lives in the parent
// module so `in_flight` need not import the driver that imports it.
pub use super::Operation;

/// Counts and timings the metrics endpoint exposes.
pub trait DriverObserver: Send + Sync + 'static {
    /// A kubelet call with this many claims begins; each ends with `prepared`/`unprepared`.
    fn starting(&self, _operation: Operation, _claims: usize) {}
    fn prepared(&self, _claim: &ClaimRef, _ok: bool, _seconds: f64) {}
    fn unprepared(&self, _claim: &ClaimRef, _ok: bool, _seconds: f64) {}
    fn state_changed(&self, _state: &DeviceState) {}
    /// The pods a claim of this node is reserved for (`status.reservedFor`), as last read: at
    /// each prepare call and each garbage collection round.
    fn claim_users(&self, _claim_uid: &str, _pods: &[ClaimUser]) {}
}

/// A pod a claim is reserved for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimUser {
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
}

/// The pods a claim is reserved for.
fn reserved_pods(claim: &k8s_openapi::api::resource::v1::ResourceClaim) -> Vec<ClaimUser> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| ClaimUser {
            pod: format!("{namespace}/{}", r.name),
            uid: r.uid.clone(),
        })
        .collect()
}

struct NoObserver;
impl DriverObserver for NoObserver {}

pub struct Driver {
    state: Arc<DeviceState>,
    claims: Arc<dyn ClaimSource>,
    observer: Arc<dyn DriverObserver>,
    /// Set when another instance may share the node (rolling update).
    sharing: Option<NodeSharing>,
    /// How long a prepared claim must stay gone before garbage collection unprepares it.
    gc_grace: Duration,
    /// When each prepared claim was first seen gone (by UID).
    gone_since: std::sync::Mutex<HashMap<String, Instant>>,
    /// The claims an operation runs for now: a second call for one joins or is told to retry.
    in_flight: Arc<InFlight>,
}

/// Kubelet unprepares a deleted pod's claims itself once its containers are dead, which can be
/// after the claim object is gone (a pod deleted with a short grace period): garbage collection
/// only takes over when kubelet has clearly not (it was down, or the driver was).
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(30);

/// How this instance shares the node with others during a rolling update.
struct NodeSharing {
    lock: NodeLock,
    presence: Presence,
    /// This instance's book matches the checkpoint on disk and no other instance was seen since:
    /// operations may take the node lock shared. Cleared whenever another instance is seen.
    synced_alone: AtomicBool,
}

/// What an operation holds of the node: nothing (no other instance can exist), the node lock
/// shared (this instance is alone), or exclusively (another instance runs). Moved into the
/// blocking work it protects, so a cancelled call cannot release it under running work.
#[derive(Debug)]
pub struct NodeHold {
    _guard: Option<NodeLockGuard>,
}

impl Driver {
    pub fn new(state: DeviceState, claims: Arc<dyn ClaimSource>) -> Self {
        Self {
            state: Arc::new(state),
            claims,
            observer: Arc::new(NoObserver),
            sharing: None,
            gc_grace: DEFAULT_GC_GRACE,
            gone_since: std::sync::Mutex::new(HashMap::new()),
            in_flight: Arc::default(),
        }
    }

    /// How many claims an operation runs for now (stuck ones included).
    pub fn claims_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// How long a claim must stay gone before garbage collection unprepares it.
    pub fn with_gc_grace(mut self, grace: Duration) -> Self {
        self.gc_grace = grace;
        self
    }

    /// Shares the node with other instances (`presence` is this one's): while another one runs,
    /// every state change takes `lock` exclusively and starts from the checkpoint on disk.
    pub fn with_node_lock(mut self, lock: NodeLock, presence: Presence) -> Self {
        self.sharing = Some(NodeSharing {
            lock,
            presence,
            // Recovery at start read the checkpoint from disk under the lock.
            synced_alone: AtomicBool::new(true),
        });
        self
    }

    /// Without a node lock (the usual case) this holds nothing: operations run side by side,
    /// kept apart by their claims and GPUs. With one, an instance alone on the node holds it
    /// shared (still side by side); while another instance runs it holds it exclusively and
    /// first adopts what the other instance wrote.
    pub async fn hold_node(&self) -> Result<NodeHold, String> {
        let Some(sharing) = &self.sharing else {
            return Ok(NodeHold { _guard: None });
        };
        let lock_error =
            |e: std::io::Error| format!("cannot lock {}: {e}", sharing.lock.path().display());
        let shared = sharing.lock.acquire_shared().await.map_err(lock_error)?;
        // Looked at under the shared lock: an instance that registered since holds the lock
        // exclusively for each of its operations, so none of them can be running now. One that
        // registered and died since (a crash-looping new image) counts too: it may have written.
        if sharing.synced_alone.load(Ordering::SeqCst) && self.others(sharing)?.none() {
            return Ok(NodeHold {
                _guard: Some(shared),
            });
        }
        drop(shared);
        let exclusive = sharing.lock.acquire().await.map_err(lock_error)?;
        let state = self.state.clone();
        let (exclusive, adopted) = run_blocking(move || {
            let adopted = state.sync_with_disk()?;
            Ok((exclusive, adopted))
        })
        .await
        .map_err(|e| e.to_string())?;
        if adopted {
            tracing::debug!("adopted the checkpoint another driver instance wrote");
            self.observer.state_changed(&self.state);
        }
        // Every write happens under the lock, which is held here exclusively: what the instances
        // that are gone wrote was read above, so they can be forgotten.
        let others = self.others(sharing)?;
        sharing
            .presence
            .forget(&others.gone)
            .map_err(|e| format!("cannot remove gone driver instances' files: {e}"))?;
        sharing
            .synced_alone
            .store(others.alive.is_empty(), Ordering::SeqCst);
        Ok(NodeHold {
            _guard: Some(exclusive),
        })
    }

    fn others(&self, sharing: &NodeSharing) -> Result<Others, String> {
        let others = sharing
            .presence
            .others()
            .map_err(|e| format!("cannot tell which driver instances run on the node: {e}"))?;
        if !others.none() {
            sharing.synced_alone.store(false, Ordering::SeqCst);
        }
        Ok(others)
    }

    pub fn with_observer(mut self, observer: Arc<dyn DriverObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// The node's device state.
    pub fn state(&self) -> &DeviceState {
        &self.state
    }

    /// Discovers the hardware again (devices made or removed by someone else, a GPU lost or
    /// back): the GPUs in `only`, or all. GPUs an operation holds are skipped, never waited for.
    /// Observers hear of a change. Returns whether anything changed.
    pub async fn rescan(&self, only: Option<BTreeSet<u32>>) -> Result<bool, String> {
        let state = self.state.clone();
        let changed = run_blocking(move || state.rescan(only.as_ref()))
            .await
            .map_err(|e| e.to_string())?;
        if changed {
            self.observer.state_changed(&self.state);
        }
        Ok(changed)
    }

    /// Runs `f` on the state (inspection in the demo and tests).
    pub async fn with_state<R>(&self, f: impl FnOnce(&DeviceState) -> R) -> R {
        f(&self.state)
    }

    /// Unprepares claims that were deleted (or deleted and re-created under a new UID) while they
    /// were prepared here, e.g. while the plugin was down (NVIDIA driver #1278). Claims whose
    /// lookup fails are left for the next round.
    pub async fn collect_garbage(&self) -> Vec<ClaimRef> {
        let recorded = match self.hold_node().await {
            Ok(_hold) => self.state.claims(),
            Err(e) => {
                tracing::error!(error = %e, "garbage collection: cannot read the node's state");
                return vec![];
            }
        };
        // A claim taken over from NVIDIA's driver, which records no names, cannot be looked up
        // until the kubelet names it (a prepare); its unprepare still comes from the kubelet.
        let recorded: Vec<ClaimRef> = recorded
            .into_iter()
            .filter(|c| {
                let named = !c.name.is_empty();
                if !named {
                    tracing::debug!(claimUID = %c.uid, "garbage collection: a claim taken over without its name is left to the kubelet");
                }
                named
            })
            .collect();
        let driver_name = self.state.config().driver_name.clone();
        let pool = self.state.config().node_name.clone();
        {
            let mut since = self.gone_since.lock().unwrap_or_else(|p| p.into_inner());
            since.retain(|uid, _| recorded.iter().any(|c| c.uid == *uid));
        }
        let lookups = join_all(
            recorded
                .iter()
                .map(|c| self.claims.get(&c.namespace, &c.name)),
        )
        .await;
        let mut collected = Vec::new();
        for (claim, lookup) in recorded.into_iter().zip(lookups) {
            let gone = match lookup {
                Ok(None) => true,
                // Re-created under a new UID, deallocated, or now allocated elsewhere: its devices
                // may go to someone else, so they must not stay prepared here.
                Ok(Some(current)) => {
                    let replaced = current.metadata.uid.as_deref() != Some(claim.uid.as_str());
                    if !replaced {
                        self.observer
                            .claim_users(&claim.uid, &reserved_pods(&current));
                    }
                    replaced || !allocated_here(&current, &driver_name, &pool)
                }
                Err(e) => {
                    tracing::warn!(claim = %claim, claimUID = %claim.uid, error = %e, "garbage collection: cannot look the claim up");
                    false
                }
            };
            if !self.gone_long_enough(&claim.uid, gone) {
                continue;
            }
            let in_flight = match self.in_flight.start(&claim, Operation::Unprepare) {
                Entry::Started(guard) => guard,
                Entry::Joined(_) | Entry::Busy(_) => {
                    tracing::info!(claim = %claim, claimUID = %claim.uid, "garbage collection: an operation runs for the claim; looked at again next round");
                    continue;
                }
            };
            let hold = match self.hold_node().await {
                Ok(hold) => hold,
                Err(e) => {
                    tracing::error!(error = %e, "garbage collection: cannot read the node's state");
                    break;
                }
            };
            let (state, uid) = (self.state.clone(), claim.uid.clone());
            match run_blocking(move || {
                let _hold = hold;
                let result = state.unprepare(&uid);
                in_flight.finish(Outcome::Unprepared(
                    result.as_ref().map(|_| ()).map_err(ToString::to_string),
                ));
                result
            })
            .await
            {
                Ok(()) => {
                    tracing::info!(claim = %claim, claimUID = %claim.uid, "garbage collection: unprepared a claim that no longer exists");
                    self.observer.state_changed(&self.state);
                    collected.push(claim);
                }
                Err(e) => {
                    tracing::error!(claim = %claim, claimUID = %claim.uid, error = %e, "garbage collection: unprepare failed")
                }
            }
        }
        collected
    }

    /// Starts again the MPS daemons of prepared claims that stopped answering (see
    /// [`DeviceState::repair_mps`]); runs with garbage collection.
    pub async fn repair_sharing(&self) -> Vec<String> {
        let hold = match self.hold_node().await {
            Ok(hold) => hold,
            Err(e) => {
                tracing::error!(error = %e, "MPS repair: cannot read the node's state");
                return vec![];
            }
        };
        let state = self.state.clone();
        match run_blocking(move || {
            let _hold = hold;
            state.repair_mps()
        })
        .await
        {
            Ok(started) => started,
            Err(e) => {
                tracing::error!(error = %e, "MPS repair failed; tried again at the next round");
                vec![]
            }
        }
    }

    /// Whether a claim seen `gone` now has been gone for the grace period; forgets claims that
    /// are back (or were never gone).
    fn gone_long_enough(&self, uid: &str, gone: bool) -> bool {
        let mut since = self.gone_since.lock().unwrap_or_else(|p| p.into_inner());
        if !gone {
            since.remove(uid);
            return false;
        }
        let first_seen = *since.entry(uid.to_string()).or_insert_with(Instant::now);
        if first_seen.elapsed() < self.gc_grace {
            return false;
        }
        since.remove(uid);
        true
    }
}

#[tonic::async_trait]
impl NodeDriver for Driver {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, PrepareResult)> {
        let started = Instant::now();
        self.observer.starting(Operation::Prepare, claims.len());
        // A claim whose prepare still runs joins it; one whose unprepare runs is answered busy:
        // neither takes a lookup or a thread.
        let in_flight: Vec<_> = claims
            .iter()
            .map(|c| self.in_flight.start(c, Operation::Prepare))
            .collect();
        // Claim lookups need no lock and run concurrently.
        let fetched = join_all(claims.iter().zip(&in_flight).map(|(c, entry)| async move {
            match entry {
                Entry::Started(_) => Some(self.claims.get(&c.namespace, &c.name).await),
                Entry::Joined(_) | Entry::Busy(_) => None,
            }
        }))
        .await;
        let hold = match self.hold_node().await {
            Ok(hold) => Arc::new(hold),
            Err(e) => {
                tracing::error!(error = %e, "prepare: cannot read the node's state");
                let seconds = started.elapsed().as_secs_f64();
                for claim in &claims {
                    self.observer.prepared(claim, false, seconds);
                }
                return claims.into_iter().map(|c| (c, Err(e.clone()))).collect();
            }
        };
        // Each claim on its own blocking thread: the state lets claims on different GPUs run side
        // by side and makes the others wait their turn. Each thread owns a share of the hold.
        let work = claims.into_iter().zip(fetched).zip(in_flight);
        let results = join_all(work.map(|((claim, fetched), entry)| {
            let (state, hold) = (self.state.clone(), hold.clone());
            async move {
                let result = match (entry, fetched) {
                    (Entry::Busy(why), _) => Err(why),
                    (Entry::Joined(joined), _) => {
                        // The joined call's work holds the node; waiting keeps no share of it.
                        drop(hold);
                        joined.prepared().await
                    }
                    (Entry::Started(in_flight), Some(Ok(Some(object)))) => {
                        if object.metadata.uid.as_deref() == Some(claim.uid.as_str()) {
                            self.observer
                                .claim_users(&claim.uid, &reserved_pods(&object));
                        }
                        let claim = claim.clone();
                        run_blocking(move || {
                            let _hold = hold;
                            let result = state.prepare(&claim, &object).map_err(|e| e.to_string());
                            in_flight.finish(Outcome::Prepared(result.clone()));
                            Ok(result)
                        })
                        .await
                        .map_err(|e| e.to_string())
                        .and_then(|result| result)
                    }
                    (Entry::Started(_), Some(Ok(None))) => Err(format!(
                        "ResourceClaim {}/{} not found",
                        claim.namespace, claim.name
                    )),
                    (Entry::Started(_), Some(Err(e))) => Err(e),
                    (Entry::Started(_), None) => Err(format!(
                        "ResourceClaim {}/{}: not looked up",
                        claim.namespace, claim.name
                    )),
                };
                self.observer
                    .prepared(&claim, result.is_ok(), started.elapsed().as_secs_f64());
                (claim, result)
            }
        }))
        .await;
        let statuses: Vec<_> = results
            .iter()
            .filter(|(_, result)| result.is_ok())
            .map(|(claim, _)| {
                (
                    claim.clone(),
                    self.state.device_status(&claim.uid),
                    self.state.warnings(&claim.uid),
                )
            })
            .collect();
        self.observer.state_changed(&self.state);
        drop(hold);
        // Reporting devices in the claim's status is informational: it goes out after the answer
        // (containers need not wait for an API round trip), a failure is logged, and the
        // containers get their devices either way.
        let mut warned = Vec::new();
        let mut reports = Vec::new();
        for (claim, devices, warnings) in statuses {
            if !warnings.is_empty() {
                warned.push((claim.clone(), warnings));
            }
            reports.push((claim, devices));
        }
        let claims = Arc::clone(&self.claims);
        tokio::spawn(async move {
            join_all(reports.into_iter().map(|(claim, devices)| {
                let claims = Arc::clone(&claims);
                async move {
                    if let Err(e) = claims
                        .set_device_status(&claim.namespace, &claim.name, devices)
                        .await
                    {
                        tracing::warn!(claim = %claim, claimUID = %claim.uid, error = %e, "cannot report prepared devices in the claim's status");
                    }
                }
            }))
            .await;
        });
        // Warnings are rare and say what the containers will not get: posted before the answer.
        join_all(warned.into_iter().map(|(claim, warnings)| async move {
            for (reason, note) in warnings {
                tracing::warn!(claim = %claim, claimUID = %claim.uid, reason, "{note}");
                if let Err(e) = self.claims.warn(&claim, reason, &note).await {
                    tracing::warn!(claim = %claim, claimUID = %claim.uid, error = %e, "cannot post a Warning Event on the claim");
                }
            }
        }))
        .await;
        results
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, UnprepareResult)> {
        let started = Instant::now();
        self.observer.starting(Operation::Unprepare, claims.len());
        let hold = match self.hold_node().await {
            Ok(hold) => Arc::new(hold),
            Err(e) => {
                tracing::error!(error = %e, "unprepare: cannot read the node's state");
                let seconds = started.elapsed().as_secs_f64();
                for claim in &claims {
                    self.observer.unprepared(claim, false, seconds);
                }
                return claims.into_iter().map(|c| (c, Err(e.clone()))).collect();
            }
        };
        let results = join_all(claims.into_iter().map(|claim| {
            let (state, hold) = (self.state.clone(), hold.clone());
            let entry = self.in_flight.start(&claim, Operation::Unprepare);
            async move {
                let uid = claim.uid.clone();
                let result = match entry {
                    Entry::Started(in_flight) => run_blocking(move || {
                        let _hold = hold;
                        let result = state.unprepare(&uid).map_err(|e| e.to_string());
                        in_flight.finish(Outcome::Unprepared(result.clone()));
                        Ok(result)
                    })
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|result| result),
                    Entry::Joined(joined) => {
                        drop(hold);
                        joined.unprepared().await
                    }
                    Entry::Busy(why) => Err(why),
                };
                self.observer
                    .unprepared(&claim, result.is_ok(), started.elapsed().as_secs_f64());
                (claim, result)
            }
        }))
        .await;
        self.observer.state_changed(&self.state);
        results
    }
}

/// Whether the claim's allocation still names a device of this driver in this node's pool.
fn allocated_here(
    claim: &k8s_openapi::api::resource::v1::ResourceClaim,
    driver_name: &str,
    pool: &str,
) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .is_some_and(|results| {
            results
                .iter()
                .any(|r| r.driver == driver_name && r.pool == pool)
        })
}

/// Runs hardware and disk work (MIG changes through NVML take up to seconds; every checkpoint
/// write is an fsync) on a blocking thread, so the async workers keep serving kubelet's
/// registration and health streams, probes and slice publication, and operations on different
/// GPUs overlap.
async fn run_blocking<R: Send + 'static>(
    work: impl FnOnce() -> Result<R, PrepareError> + Send + 'static,
) -> Result<R, PrepareError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        // A panic in the work: surface it rather than take the whole agent down.
        Err(joined) => Err(PrepareError::Internal(format!(
            "the operation's thread failed: {joined}"
        ))),
    }
}
