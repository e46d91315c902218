//! Kubernetes' structured-parameters allocator (kube-scheduler's DynamicResources plugin) for
//! one node, reproduced so that `match`, `explain` and packing studies pick exactly the devices
//! the scheduler would.
//!
//! The reference is `k8s.io/dynamic-resource-allocation/structured` v0.37, the "incubating"
//! implementation: with the 1.37 default feature gates (consumable capacity, binding conditions)
//! that is the one `NewAllocator` picks. With alpha gates on (list-type attributes, compatibility
//! groups, optional node operations: the e2e cluster's `K8S_FEATURE_GATES`) it picks the
//! "experimental" one, whose differences are reproduced behind the same [`Features`] switches
//! (see [`Features::from_feature_gates`]), derived attributes included. Search order,
//! backtracking, memoization boundaries and error texts follow Go; only the data layout is ours
//! (devices are flattened into one candidate list per node, selector results are cached across
//! calls, device views are built once).
//!
//! Entry point: [`Allocator::allocate`] allocates the claims of one pod on one node, like one
//! scheduling cycle; callers that allocate several pods in a row mark each result in an
//! [`AllocatedState`] as the scheduler's allocated-devices tracker does.
mod capacity;
mod derived;
pub mod explain;
pub mod gates;
pub mod load;
mod nodesel;
mod pools;
mod result;
mod search;

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use dra_cel::{CelError, DeviceView, Selector, SelectorCache};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use k8s_quantity::Quantity;

pub use nodesel::selector_matches as node_selector_matches;
pub use search::{OPTIONAL_NODE_OPERATIONS, Outcome};

/// Allocator switches; each mirrors a `structured.Features` field (and so a feature gate),
/// fields sorted as in Go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    pub admin_access: bool,
    pub compatibility_groups: bool,
    pub consumable_capacity: bool,
    /// Requests' `derivedAttributes` stand for devices' attributes in constraints.
    pub derived_attributes: bool,
    pub device_binding_and_status: bool,
    pub device_taints: bool,
    pub fractional_capacity_range: bool,
    pub list_type_attributes: bool,
    pub optional_node_operations: bool,
    pub partitionable_devices: bool,
    pub prioritized_list: bool,
}

impl Features {
    /// kube-scheduler 1.37 with default feature gates (what the `alloc-oracle` runs).
    /// DRAFractionalCapacityRange is beta but only defaults on once the minimum compatibility
    /// version reaches 1.37, so a default 1.37 scheduler still rounds capacity in integers.
    pub const KUBERNETES_1_37: Features = Features {
        admin_access: true,
        compatibility_groups: false,
        consumable_capacity: true,
        derived_attributes: false,
        device_binding_and_status: true,
        device_taints: true,
        fractional_capacity_range: false,
        list_type_attributes: false,
        optional_node_operations: false,
        partitionable_devices: true,
        prioritized_list: true,
    };

    /// The features kube-scheduler 1.37 derives from its `--feature-gates` value (applied on
    /// top of the 1.37 defaults, validated as `featuregate` does).
    pub fn from_feature_gates(spec: &str) -> Result<Features, gates::GateError> {
        gates::features(spec)
    }

    /// Whether `NewAllocator` picks the "experimental" implementation: any feature the
    /// "incubating" one does not support is on. A few behaviours differ even for switches
    /// that are off (devices of slices with `skipNodeOperations` become unallocatable).
    pub fn experimental(&self) -> bool {
        self.compatibility_groups
            || self.derived_attributes
            || self.list_type_attributes
            || self.optional_node_operations
    }
}

impl Default for Features {
    fn default() -> Self {
        Self::KUBERNETES_1_37
    }
}

/// A device's identity: driver, pool and device name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl DeviceId {
    pub fn new(driver: &str, pool: &str, device: &str) -> Self {
        Self {
            driver: driver.to_string(),
            pool: pool.to_string(),
            device: device.to_string(),
        }
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// Devices already in use by allocated claims (the scheduler's `AllocatedState`).
#[derive(Debug, Clone, Default)]
pub struct AllocatedState {
    /// Devices allocated exclusively.
    pub devices: HashSet<DeviceId>,
    /// Share IDs of allow-multiple-allocations devices, per device.
    pub shares: HashMap<DeviceId, HashSet<String>>,
    /// Capacity consumed by shares, per device and capacity name.
    pub consumed_capacity: HashMap<DeviceId, BTreeMap<String, Quantity>>,
    /// Which claim holds a device, for explanations only.
    pub holders: HashMap<DeviceId, Vec<String>>,
}

impl AllocatedState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks an allocation's devices as in use, as the scheduler's `foreachAllocatedDevice`
    /// does: admin-access results take nothing; with consumable capacity, results with a share
    /// ID take a share (and its capacity) instead of the whole device.
    pub fn mark(
        &mut self,
        holder: &str,
        allocation: &AllocationResult,
        features: &Features,
    ) -> Result<(), AllocError> {
        let results = allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten());
        for r in results {
            if r.admin_access == Some(true) {
                continue;
            }
            let id = DeviceId::new(&r.driver, &r.pool, &r.device);
            self.holders
                .entry(id.clone())
                .or_default()
                .push(holder.to_string());
            if features.consumable_capacity
                && let Some(share) = &r.share_id
            {
                self.shares
                    .entry(id.clone())
                    .or_default()
                    .insert(share.clone());
                if let Some(consumed) = &r.consumed_capacity {
                    let entry = self.consumed_capacity.entry(id).or_default();
                    for (name, q) in consumed {
                        let q = Quantity::parse(&q.0).map_err(|e| {
                            AllocError(format!("{holder}: consumedCapacity {name}: {:?}: {e}", q.0))
                        })?;
                        let sum = match entry.get(name) {
                            Some(prev) => prev.add(&q),
                            None => q,
                        };
                        entry.insert(name.clone(), sum);
                    }
                }
                continue;
            }
            self.devices.insert(id);
        }
        Ok(())
    }

    /// `IsDeviceAllocated`: allocated whole, shared, or with consumed capacity.
    pub fn is_allocated(&self, id: &DeviceId) -> bool {
        self.devices.contains(id)
            || self.shares.get(id).is_some_and(|s| !s.is_empty())
            || self.consumed_capacity.contains_key(id)
    }
}

/// The node allocation is for. Slices select nodes by name, labels, or `metadata.name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `status.declaredFeatures`: the experimental allocator only hands out devices of slices
    /// with `skipNodeOperations` on nodes declaring `DRAOptionalNodeOperations`.
    pub declared_features: Vec<String>,
}

impl NodeInfo {
    /// A node with only the `kubernetes.io/hostname` label, as the oracle builds it.
    pub fn named(name: &str) -> Self {
        let mut labels = BTreeMap::new();
        labels.insert("kubernetes.io/hostname".to_string(), name.to_string());
        Self {
            name: name.to_string(),
            labels,
            declared_features: Vec::new(),
        }
    }
}

/// A fatal allocation error: kube-scheduler aborts the scheduling attempt with this text
/// (bad CEL, unknown class, malformed request), instead of marking the node unschedulable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AllocError(pub String);

/// Index of one device in one slice, across all slices the allocator holds.
type Slot = usize;

/// A compiled selector plus its results per device, kept across allocations.
struct SelectorEntry {
    expression: String,
    compiled: OnceCell<Arc<Result<Selector, CelError>>>,
    /// Per slot: None = not evaluated yet.
    results: Vec<Option<Result<bool, CelError>>>,
}

/// Allocates claims against a fixed set of slices and classes. Built once, used for any
/// number of claims and nodes; caches (pools per node, device views, selector results) fill
/// on demand. Not `Sync`: build one per thread.
pub struct Allocator {
    features: Features,
    slices: Arc<Vec<ResourceSlice>>,
    classes: Arc<Vec<DeviceClass>>,
    compiler: Arc<SelectorCache>,
    class_index: HashMap<String, usize>,
    /// First slot of each slice.
    slot_base: Vec<Slot>,
    slot_count: usize,
    views: Vec<OnceCell<Result<DeviceView, String>>>,
    capacities: Vec<OnceCell<Result<Vec<capacity::CapacityDef>, String>>>,
    selector_index: RefCell<HashMap<String, usize>>,
    selectors: RefCell<Vec<SelectorEntry>>,
    pools: RefCell<HashMap<NodeInfo, Rc<pools::NodePools>>>,
    filter_timeout: Option<Duration>,
    allocate_one_invocations: Cell<u64>,
}

/// What an [`Allocator`] is built from: the same slices, classes, compiled selectors and
/// settings, for an allocator of its own on another thread (an `Allocator` is not `Send`).
#[derive(Clone)]
pub struct AllocatorInputs {
    features: Features,
    slices: Arc<Vec<ResourceSlice>>,
    classes: Arc<Vec<DeviceClass>>,
    compiler: Arc<SelectorCache>,
    filter_timeout: Option<Duration>,
}

impl AllocatorInputs {
    /// A new allocator over these inputs, its caches empty.
    pub fn build(self) -> Allocator {
        Allocator::shared(self.features, self.slices, self.classes, self.compiler)
            .with_filter_timeout(self.filter_timeout)
    }
}

/// kube-scheduler's default DynamicResources `filterTimeout`: an allocation attempt on one node
/// that searches longer gives up (the pod is retried with backoff).
pub const DEFAULT_FILTER_TIMEOUT: Duration = Duration::from_secs(10);

impl Allocator {
    pub fn new(features: Features, slices: Vec<ResourceSlice>, classes: Vec<DeviceClass>) -> Self {
        Self::shared(
            features,
            Arc::new(slices),
            Arc::new(classes),
            Arc::new(SelectorCache::new()),
        )
    }

    /// Like [`new`](Self::new), sharing inputs and compiled selectors with other allocators
    /// (kube-scheduler keeps its CEL cache across scheduling cycles too).
    pub fn shared(
        features: Features,
        slices: Arc<Vec<ResourceSlice>>,
        classes: Arc<Vec<DeviceClass>>,
        compiler: Arc<SelectorCache>,
    ) -> Self {
        let mut slot_base = Vec::with_capacity(slices.len());
        let mut slot_count = 0;
        for slice in slices.iter() {
            slot_base.push(slot_count);
            slot_count += slice.spec.devices.as_ref().map_or(0, Vec::len);
        }
        // The scheduler's class lister returns the first class of a name.
        let mut class_index = HashMap::new();
        for (i, class) in classes.iter().enumerate() {
            if let Some(name) = &class.metadata.name {
                class_index.entry(name.clone()).or_insert(i);
            }
        }
        Self {
            features,
            slices,
            classes,
            compiler,
            class_index,
            slot_base,
            slot_count,
            views: (0..slot_count).map(|_| OnceCell::new()).collect(),
            capacities: (0..slot_count).map(|_| OnceCell::new()).collect(),
            selector_index: RefCell::new(HashMap::new()),
            selectors: RefCell::new(Vec::new()),
            pools: RefCell::new(HashMap::new()),
            filter_timeout: Some(DEFAULT_FILTER_TIMEOUT),
            allocate_one_invocations: Cell::new(0),
        }
    }

    /// Bounds each [`allocate`](Self::allocate) call as kube-scheduler's `filterTimeout`
    /// does (default [`DEFAULT_FILTER_TIMEOUT`]; `None` searches without limit, like a
    /// scheduler configured with `filterTimeout: 0s`). A search that runs out of time fails
    /// with the scheduler's error, `node NAME: timed out trying to allocate devices`.
    pub fn with_filter_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.filter_timeout = timeout.filter(|t| !t.is_zero());
        self
    }

    /// How often the search stepped (`allocateOne` calls) over all [`allocate`](Self::allocate)
    /// calls so far: Go's `Stats.NumAllocateOneInvocations`, which Kubernetes' allocator tests
    /// pin for searches that must prune (e2e/upstream-tables.sh compares them).
    pub fn allocate_one_invocations(&self) -> u64 {
        self.allocate_one_invocations.get()
    }

    fn count_allocate_one_invocations(&self, steps: u64) {
        self.allocate_one_invocations
            .set(self.allocate_one_invocations.get().saturating_add(steps));
    }

    /// The `structured` implementation whose behaviour this allocator reproduces for its
    /// features: `experimental` when a feature only that one has is on, else `incubating`.
    pub fn channel(&self) -> &'static str {
        if self.features.experimental() {
            "experimental"
        } else {
            "incubating"
        }
    }

    pub fn filter_timeout(&self) -> Option<Duration> {
        self.filter_timeout
    }

    pub fn features(&self) -> &Features {
        &self.features
    }

    /// Forgets what was cached for `node` (its pools, its devices' CEL views, capacities and
    /// selector results; each is built again if asked for). A fleet counted node after node
    /// then reuses that memory: at 1,000 nodes, taking fresh pages for it was a fifth of the
    /// time.
    pub fn release_node(&mut self, node: &NodeInfo) {
        let Some(pools) = self.pools.get_mut().remove(node) else {
            return;
        };
        for candidate in &pools.candidates {
            self.views[candidate.slot].take();
            self.capacities[candidate.slot].take();
        }
        for selector in self.selectors.get_mut() {
            for candidate in &pools.candidates {
                selector.results[candidate.slot] = None;
            }
        }
    }

    /// What this allocator was built from, to build another on another thread.
    pub fn inputs(&self) -> AllocatorInputs {
        AllocatorInputs {
            features: self.features,
            slices: self.slices.clone(),
            classes: self.classes.clone(),
            compiler: self.compiler.clone(),
            filter_timeout: self.filter_timeout,
        }
    }

    pub fn slices(&self) -> &[ResourceSlice] {
        &self.slices
    }

    pub fn classes(&self) -> &[DeviceClass] {
        &self.classes
    }

    pub fn class(&self, name: &str) -> Option<&DeviceClass> {
        self.class_index.get(name).map(|&i| &self.classes[i])
    }

    /// Allocates all `claims` (one pod's) on `node` given the devices already in use:
    /// `Allocated` with one result per claim, `Unsatisfiable` when the node cannot take
    /// them, or an error where kube-scheduler would abort the scheduling attempt.
    pub fn allocate(
        &self,
        node: &NodeInfo,
        claims: &[ResourceClaim],
        state: &AllocatedState,
    ) -> Result<Outcome, AllocError> {
        let pools = self.node_pools(node)?;
        search::allocate(self, &pools, node, claims, state)
    }

    /// Pools with devices for `node`, gathered once per node.
    fn node_pools(&self, node: &NodeInfo) -> Result<Rc<pools::NodePools>, AllocError> {
        if let Some(p) = self.pools.borrow().get(node) {
            return Ok(p.clone());
        }
        let gathered = Rc::new(pools::gather(self, node)?);
        self.pools
            .borrow_mut()
            .insert(node.clone(), gathered.clone());
        Ok(gathered)
    }

    fn slot(&self, slice: usize, device: usize) -> Slot {
        self.slot_base[slice] + device
    }

    /// The CEL view of a device, built on first use.
    fn view(&self, slot: Slot, slice: usize, device: usize) -> Result<&DeviceView, String> {
        let cell = &self.views[slot];
        let built = cell.get_or_init(|| {
            let spec = &self.slices[slice].spec;
            match spec.devices.as_ref().and_then(|d| d.get(device)) {
                Some(dev) => DeviceView::new(&spec.driver, dev).map_err(|e| e.to_string()),
                None => Err("device index out of range".to_string()),
            }
        });
        built.as_ref().map_err(Clone::clone)
    }

    /// A device's capacities with their request policies, parsed on first use.
    fn capacities(
        &self,
        slot: Slot,
        slice: usize,
        device: usize,
    ) -> Result<&[capacity::CapacityDef], String> {
        let parsed = self.capacities[slot].get_or_init(|| {
            let dev = self.slices[slice]
                .spec
                .devices
                .as_ref()
                .and_then(|d| d.get(device));
            capacity::parse_capacities(dev.and_then(|d| d.capacity.as_ref()))
        });
        match parsed {
            Ok(caps) => Ok(caps),
            Err(e) => Err(format!("capacity: {e}")),
        }
    }

    /// Interned selector expression (compiled lazily, like the scheduler's cache does on
    /// first evaluation: an expression no device reaches never reports a compile error).
    fn selector_id(&self, expression: &str) -> usize {
        if let Some(&id) = self.selector_index.borrow().get(expression) {
            return id;
        }
        let mut entries = self.selectors.borrow_mut();
        let id = entries.len();
        entries.push(SelectorEntry {
            expression: expression.to_string(),
            compiled: OnceCell::new(),
            results: vec![None; self.slot_count],
        });
        self.selector_index
            .borrow_mut()
            .insert(expression.to_string(), id);
        id
    }

    /// Evaluates one selector on one device: `Err(Compile)` when it does not compile,
    /// `Err(Runtime)` when evaluation fails. Results are cached per device.
    fn evaluate(
        &self,
        selector: usize,
        slot: Slot,
        slice: usize,
        device: usize,
    ) -> Result<Result<bool, CelError>, String> {
        let mut entries = self.selectors.borrow_mut();
        let entry = &mut entries[selector];
        if let Some(done) = &entry.results[slot] {
            return Ok(done.clone());
        }
        // Compile before looking at the device: a compile error wins, as in Go.
        let compiled = entry.compiled.get_or_init(|| {
            self.compiler.get_or_compile_with(
                &entry.expression,
                dra_cel::Features {
                    consumable_capacity: self.features.consumable_capacity,
                },
            )
        });
        let result = match &**compiled {
            Ok(sel) => sel.evaluate(self.view(slot, slice, device)?),
            Err(e) => return Ok(Err(e.clone())),
        };
        entry.results[slot] = Some(result.clone());
        Ok(result)
    }
}

/// A claim as kube-scheduler names it in messages (`namespace/name`).
pub fn claim_name(claim: &ResourceClaim) -> String {
    kobj(claim)
}

/// `klog.KObj`: `namespace/name`, or `name` for cluster-scoped objects.
pub(crate) fn kobj(claim: &ResourceClaim) -> String {
    let name = claim.metadata.name.as_deref().unwrap_or("");
    match claim.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// The `spec.devices` of a claim, if any.
pub(crate) fn device_claim(
    claim: &ResourceClaim,
) -> Option<&k8s_openapi::api::resource::v1::DeviceClaim> {
    claim.spec.as_ref()?.devices.as_ref()
}
