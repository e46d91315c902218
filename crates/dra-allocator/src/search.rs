//! The exhaustive first-fit search (`allocateOne` / `allocateDevice`): claims in order,
//! requests in order, for each needed device the candidates in pool/slice/device order;
//! every pick is checked against use, selectors, capacity, counters, taints and constraints,
//! and undone when a later step fails.
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use dra_cel::CelError;
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceClass, DeviceRequest, DeviceSelector, DeviceTaint,
    DeviceToleration, ResourceClaim,
};

use super::capacity::{self, Amount, CapacityDef, Consumed};
use super::derived::DerivedValues;
use super::nodesel::node_matches;
use super::pools::{Candidate, NodePools};
use super::{AllocError, AllocatedState, Allocator, DeviceId, NodeInfo, kobj};
use k8s_quantity::Quantity;

/// The node feature (`status.declaredFeatures`) devices of slices with `skipNodeOperations`
/// need.
pub const OPTIONAL_NODE_OPERATIONS: &str = "DRAOptionalNodeOperations";

/// `AllocationResultsMaxSize`: devices per claim.
pub const MAX_RESULTS_PER_CLAIM: i64 = 32;

/// What [`Allocator::allocate`] decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// One allocation result per claim, in claim order.
    Allocated(Vec<k8s_openapi::api::resource::v1::AllocationResult>),
    /// The claims do not fit on this node. `reason` is set when kube-scheduler would report
    /// one (invalid pools); otherwise the node is simply filtered out.
    Unsatisfiable { reason: Option<String> },
}

/// Why the search stopped early.
pub(crate) enum Halt {
    /// `errAllocationResultMaxSizeExceeded`: some claim would exceed 32 results.
    MaxSize,
    Fatal(String),
    /// The filter timeout ran out (`context.DeadlineExceeded` in the scheduler).
    TimedOut,
}

type Step = Result<bool, Halt>;

/// Position in the search: which device of which (sub)request of which claim.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct At {
    pub claim: usize,
    pub request: usize,
    pub sub: usize,
    pub device: i64,
}

/// One request or subrequest, resolved and validated.
pub(crate) struct Req<'a> {
    pub name: &'a str,
    pub parent: Option<&'a str>,
    pub class: Option<&'a DeviceClass>,
    /// Selector ids; `None` for a class selector without CEL.
    pub class_selectors: Vec<Option<usize>>,
    pub selectors: Vec<usize>,
    pub all_mode: bool,
    pub num_devices: i64,
    pub admin: bool,
    /// With the apiserver's defaulting (operator Equal).
    pub tolerations: Vec<DeviceToleration>,
    pub capacity: Option<Vec<(String, Amount)>>,
    pub all_devices: Vec<usize>,
    /// Index into the per-request memo of selector results.
    pub flat: usize,
    /// Derived attributes (name, expression in [`DerivedValues`]): constraints compare these
    /// instead of the device's own attributes of that name.
    pub derived: Vec<(&'a str, usize)>,
}

impl Req<'_> {
    pub fn full_name(&self) -> String {
        match self.parent {
            Some(p) => format!("{p}/{}", self.name),
            None => self.name.to_string(),
        }
    }
}

/// A device picked for a request during the search.
#[derive(Debug, Clone)]
pub(crate) struct Pick {
    pub request: usize,
    pub sub: usize,
    pub candidate: usize,
    pub share_id: Option<String>,
    pub consumed: Option<Vec<(String, Amount)>>,
}

/// A claim constraint and what it has seen so far.
pub(crate) struct Constraint<'a> {
    pub distinct: bool,
    pub requests: Vec<&'a str>,
    pub attribute: &'a str,
    /// ListTypeAttributes: compare values as sets (scalars are one-element sets).
    list: bool,
    first: Option<AttrValue<'a>>,
    count: usize,
    seen: Vec<AttrValue<'a>>,
    /// List mode, match: the running intersection after each added device (a stack, so
    /// removing a device restores the previous one). Distinct: each added device's set.
    sets: Vec<AttrSet<'a>>,
}

/// `deviceAttributeListAsSet`: an attribute's values as a set of one type.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AttrSet<'a> {
    Int(BTreeSet<i64>),
    Bool(BTreeSet<bool>),
    Str(BTreeSet<&'a str>),
    Version(BTreeSet<&'a str>),
}

/// `attributeAsSet`: non-empty lists first (ints, bools, strings, versions), then scalars;
/// None for an attribute with neither.
pub(crate) fn attr_set(attr: &DeviceAttribute) -> Option<AttrSet<'_>> {
    fn strs(v: &[String]) -> BTreeSet<&str> {
        v.iter().map(String::as_str).collect()
    }
    match attr {
        DeviceAttribute { ints: Some(v), .. } if !v.is_empty() => {
            Some(AttrSet::Int(v.iter().copied().collect()))
        }
        DeviceAttribute { bools: Some(v), .. } if !v.is_empty() => {
            Some(AttrSet::Bool(v.iter().copied().collect()))
        }
        DeviceAttribute {
            strings: Some(v), ..
        } if !v.is_empty() => Some(AttrSet::Str(strs(v))),
        DeviceAttribute {
            versions: Some(v), ..
        } if !v.is_empty() => Some(AttrSet::Version(strs(v))),
        DeviceAttribute { int: Some(i), .. } => Some(AttrSet::Int(BTreeSet::from([*i]))),
        DeviceAttribute { bool: Some(b), .. } => Some(AttrSet::Bool(BTreeSet::from([*b]))),
        DeviceAttribute {
            string: Some(s), ..
        } => Some(AttrSet::Str(BTreeSet::from([s.as_str()]))),
        DeviceAttribute {
            version: Some(v), ..
        } => Some(AttrSet::Version(BTreeSet::from([v.as_str()]))),
        _ => None,
    }
}

impl<'a> AttrSet<'a> {
    /// The common elements of two sets of one type; None when empty or of other types.
    pub fn intersection(&self, other: &AttrSet<'a>) -> Option<AttrSet<'a>> {
        fn common<T: Ord + Copy>(a: &BTreeSet<T>, b: &BTreeSet<T>) -> Option<BTreeSet<T>> {
            let c: BTreeSet<T> = a.intersection(b).copied().collect();
            (!c.is_empty()).then_some(c)
        }
        match (self, other) {
            (AttrSet::Int(a), AttrSet::Int(b)) => common(a, b).map(AttrSet::Int),
            (AttrSet::Bool(a), AttrSet::Bool(b)) => common(a, b).map(AttrSet::Bool),
            (AttrSet::Str(a), AttrSet::Str(b)) => common(a, b).map(AttrSet::Str),
            (AttrSet::Version(a), AttrSet::Version(b)) => common(a, b).map(AttrSet::Version),
            _ => None,
        }
    }
}

/// An attribute value as constraints compare it (scalars only; anything else never matches).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum AttrValue<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Version(&'a str),
    Other,
}

pub(crate) fn attr_value(attr: &DeviceAttribute) -> AttrValue<'_> {
    if let Some(s) = &attr.string {
        AttrValue::Str(s)
    } else if let Some(i) = attr.int {
        AttrValue::Int(i)
    } else if let Some(b) = attr.bool {
        AttrValue::Bool(b)
    } else if let Some(v) = &attr.version {
        AttrValue::Version(v)
    } else {
        AttrValue::Other
    }
}

/// `lookupAttribute`: the fully qualified name, or the bare name in the driver's domain.
pub(crate) fn lookup_attribute<'d>(
    device: &'d Device,
    driver: &str,
    name: &str,
) -> Option<&'d DeviceAttribute> {
    let attrs = device.attributes.as_ref()?;
    if let Some(a) = attrs.get(name) {
        return Some(a);
    }
    let (domain, id) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    attrs.get(id)
}

impl<'a> Constraint<'a> {
    pub fn new(distinct: bool, requests: Vec<&'a str>, attribute: &'a str, list: bool) -> Self {
        Self {
            distinct,
            requests,
            attribute,
            list,
            first: None,
            count: 0,
            seen: Vec::new(),
            sets: Vec::new(),
        }
    }

    pub fn applies_to(&self, request: &str, sub: Option<&str>) -> bool {
        if self.requests.is_empty() {
            return true;
        }
        match sub {
            None => self.requests.contains(&request),
            Some(sub) => {
                self.requests.contains(&request)
                    || self.requests.iter().any(|r| {
                        r.len() == request.len() + 1 + sub.len()
                            && r.starts_with(request)
                            && r[request.len()..].starts_with('/')
                            && r.ends_with(sub)
                    })
            }
        }
    }

    /// Adds a device, whose attribute this constraint compares is `attribute`, if it keeps
    /// the constraint satisfied.
    pub fn add(
        &mut self,
        request: &str,
        sub: Option<&str>,
        attribute: Option<&'a DeviceAttribute>,
    ) -> bool {
        if !self.applies_to(request, sub) {
            return true;
        }
        let Some(attr) = attribute else {
            return false;
        };
        if self.list {
            return self.add_set(attr);
        }
        let value = attr_value(attr);
        if self.distinct {
            let clash = self.seen.iter().any(|seen| match value {
                AttrValue::Other => true,
                _ => *seen == value,
            });
            if clash {
                return false;
            }
            self.seen.push(value);
            return true;
        }
        if self.count == 0 {
            self.first = Some(value);
            self.count = 1;
            return true;
        }
        let same = match value {
            AttrValue::Other => false,
            _ => self.first == Some(value),
        };
        if !same {
            return false;
        }
        self.count += 1;
        true
    }

    /// ListTypeAttributes: match needs a non-empty running intersection, distinct needs the
    /// device's set disjoint from every earlier device's.
    fn add_set(&mut self, attr: &'a DeviceAttribute) -> bool {
        let Some(set) = attr_set(attr) else {
            return false;
        };
        if self.distinct {
            if self.sets.iter().any(|s| s.intersection(&set).is_some()) {
                return false;
            }
            self.sets.push(set);
            return true;
        }
        let next = match self.sets.last() {
            None => set,
            Some(current) => match current.intersection(&set) {
                Some(narrowed) => narrowed,
                None => return false,
            },
        };
        self.sets.push(next);
        true
    }

    pub fn remove(&mut self, request: &str, sub: Option<&str>) {
        if !self.applies_to(request, sub) {
            return;
        }
        if self.list {
            self.sets.pop();
            return;
        }
        if self.distinct {
            self.seen.pop();
        } else {
            self.count = self.count.saturating_sub(1);
        }
    }
}

/// `ToleratesTaint`.
pub(crate) fn tolerates(toleration: &DeviceToleration, taint: &DeviceTaint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        "Exists" => true,
        _ => false,
    }
}

/// The first NoSchedule/NoExecute taint no toleration covers (other effects never block).
pub(crate) fn blocking_taint<'d>(
    device: &'d Device,
    tolerations: &[DeviceToleration],
) -> Option<&'d DeviceTaint> {
    device.taints.iter().flatten().find(|taint| {
        matches!(taint.effect.as_str(), "NoExecute" | "NoSchedule")
            && !tolerations.iter().any(|t| tolerates(t, taint))
    })
}

/// `compatibilityGroupIntersection`: what the devices placed on one counter set so far
/// allow. A device without groups only goes with other devices without groups, which a
/// plain intersection cannot express, hence `all_empty`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GroupIntersection {
    has_members: bool,
    all_empty: bool,
    groups: BTreeSet<String>,
}

impl GroupIntersection {
    pub(crate) fn admits(&self, groups: &BTreeSet<String>) -> bool {
        if !self.has_members {
            return true;
        }
        if groups.is_empty() {
            return self.all_empty;
        }
        if self.all_empty {
            return false;
        }
        self.groups.intersection(groups).next().is_some()
    }

    /// What a further device must bring, for people.
    pub(crate) fn describe(&self) -> String {
        if self.all_empty {
            "only devices without compatibility groups".to_string()
        } else if self.groups.is_empty() {
            "no device with groups (theirs have none in common)".to_string()
        } else {
            let groups: Vec<&str> = self.groups.iter().map(String::as_str).collect();
            format!("devices in group {}", groups.join(" or "))
        }
    }

    fn add(&self, groups: &BTreeSet<String>) -> GroupIntersection {
        if !self.has_members {
            return GroupIntersection {
                has_members: true,
                all_empty: groups.is_empty(),
                groups: groups.clone(),
            };
        }
        if self.all_empty || groups.is_empty() {
            return self.clone();
        }
        GroupIntersection {
            has_members: true,
            all_empty: false,
            groups: self.groups.intersection(groups).cloned().collect(),
        }
    }
}

pub(crate) fn group_set(
    c: &k8s_openapi::api::resource::v1::DeviceCounterConsumption,
) -> BTreeSet<String> {
    c.compatibility_groups.iter().flatten().cloned().collect()
}

/// Everything `allocateDevice` changed for one pick, so it can be undone.
struct Undo {
    candidate: usize,
    claim: usize,
    request: usize,
    sub: usize,
    counters_reserved: bool,
    /// Compatibility-group intersections replaced by this pick: (pool, counter set, before).
    groups_replaced: Vec<(usize, String, Option<GroupIntersection>)>,
    constraints_added: usize,
    marked: bool,
    capacity_inserted: Option<Vec<(String, Quantity)>>,
    capacity_existed: bool,
    previous_results: usize,
}

/// The state of one `Allocate` call.
pub(crate) struct Run<'a> {
    pub alloc: &'a Allocator,
    pub pools: &'a NodePools,
    /// The claims' derived attributes and their values per device.
    pub derived: &'a DerivedValues,
    pub node: &'a NodeInfo,
    pub claims: &'a [ResourceClaim],
    pub state: &'a AllocatedState,
    /// [claim][request][subrequest]; exact requests have one entry.
    pub reqs: Vec<Vec<Vec<Req<'a>>>>,
    pub selected_sub: Vec<Vec<usize>>,
    pub constraints: Vec<Vec<Constraint<'a>>>,
    /// Per request (flat) and candidate: 0 unknown, 1 not selectable, 2 selectable.
    memo: RefCell<Vec<Vec<u8>>>,
    /// Per candidate: in the allocated state as a whole device.
    allocated_whole: Vec<bool>,
    /// Per candidate: a share or consumed capacity in the allocated state.
    shared_in_state: Vec<bool>,
    current_capacity: Vec<Option<&'a Consumed>>,
    /// Per candidate: claims this attempt allocates it to (exclusively).
    allocating: Vec<Vec<usize>>,
    allocating_capacity: Vec<Option<Consumed>>,
    /// Per pool: counters left after allocated devices, computed on first use.
    available: Vec<Option<Vec<Vec<Quantity>>>>,
    consumed_counters: Vec<Vec<Vec<Quantity>>>,
    /// Per pool: compatibility-group intersections of allocated devices, on first use.
    groups_baseline: Vec<Option<HashMap<String, GroupIntersection>>>,
    /// Per pool: the running intersections including this attempt's picks.
    groups_running: Vec<HashMap<String, GroupIntersection>>,
    pub results: Vec<Vec<Pick>>,
    shares_made: u64,
    /// When the filter timeout runs out; checked every `DEADLINE_CHECK_INTERVAL` steps.
    deadline: Option<Instant>,
    steps: u64,
}

/// `allocateOne` calls between clock reads: cheap enough to be invisible, frequent enough to
/// stop within milliseconds of the deadline.
const DEADLINE_CHECK_INTERVAL: u64 = 1024;

fn requests_of(claim: &ResourceClaim) -> &[DeviceRequest] {
    super::device_claim(claim)
        .and_then(|d| d.requests.as_deref())
        .unwrap_or(&[])
}

fn defaulted_tolerations(t: Option<&Vec<DeviceToleration>>) -> Vec<DeviceToleration> {
    t.into_iter()
        .flatten()
        .map(|t| {
            let mut t = t.clone();
            if t.operator.as_deref().unwrap_or("").is_empty() {
                t.operator = Some("Equal".to_string());
            }
            t
        })
        .collect()
}

/// The fields of an exact request or a subrequest the allocator looks at.
struct RequestView<'a> {
    name: &'a str,
    class_name: &'a str,
    mode: Option<&'a str>,
    count: Option<i64>,
    admin: Option<bool>,
    selectors: &'a [DeviceSelector],
    tolerations: Option<&'a Vec<DeviceToleration>>,
    capacity: Option<&'a k8s_openapi::api::resource::v1::CapacityRequirements>,
    derived_attributes: Option<&'a Vec<k8s_openapi::api::resource::v1::DeviceDerivedAttribute>>,
}

impl<'a> Run<'a> {
    pub fn new(
        alloc: &'a Allocator,
        pools: &'a NodePools,
        derived: &'a DerivedValues,
        node: &'a NodeInfo,
        claims: &'a [ResourceClaim],
        state: &'a AllocatedState,
    ) -> Self {
        let n = pools.candidates.len();
        let mut allocated_whole = vec![false; n];
        let mut shared_in_state = vec![false; n];
        let mut current_capacity = vec![None; n];
        // Usually far fewer devices are in use than the node has: look those up.
        for id in &state.devices {
            if let Some(i) = pools.find(alloc, id) {
                allocated_whole[i] = true;
            }
        }
        for (id, shares) in &state.shares {
            if let Some(i) = pools.find(alloc, id).filter(|_| !shares.is_empty()) {
                shared_in_state[i] = true;
            }
        }
        for (id, consumed) in &state.consumed_capacity {
            if let Some(i) = pools.find(alloc, id) {
                shared_in_state[i] = true;
                current_capacity[i] = Some(consumed);
            }
        }
        Self {
            alloc,
            pools,
            derived,
            node,
            claims,
            state,
            reqs: Vec::new(),
            selected_sub: Vec::new(),
            constraints: Vec::new(),
            memo: RefCell::new(Vec::new()),
            deadline: alloc.filter_timeout().map(|t| Instant::now() + t),
            steps: 0,
            allocated_whole,
            shared_in_state,
            current_capacity,
            allocating: vec![Vec::new(); n],
            allocating_capacity: vec![None; n],
            available: (0..pools.pools.len()).map(|_| None).collect(),
            consumed_counters: pools
                .pools
                .iter()
                .map(|p| {
                    p.counter_sets
                        .iter()
                        .map(|s| vec![Quantity::from_int(0); s.counters.len()])
                        .collect()
                })
                .collect(),
            groups_baseline: (0..pools.pools.len()).map(|_| None).collect(),
            groups_running: vec![HashMap::new(); pools.pools.len()],
            results: vec![Vec::new(); claims.len()],
            shares_made: 0,
        }
    }

    pub fn candidate(&self, index: usize) -> &'a Candidate {
        &self.pools.candidates[index]
    }

    /// `lookupAttribute`: the request's derived attribute of that name if it has one, else the
    /// device's own.
    pub fn attribute(
        &self,
        claim: usize,
        at: At,
        index: usize,
        device: &'a Device,
        driver: &str,
        name: &str,
    ) -> Result<Option<&'a DeviceAttribute>, String> {
        let req = &self.reqs[claim][at.request][at.sub];
        match req.derived.iter().find(|(derived, _)| *derived == name) {
            Some(&(_, expression)) => self
                .derived
                .value(self.alloc, self.pools, expression, index, name)
                .map(Some),
            None => Ok(lookup_attribute(device, driver, name)),
        }
    }

    pub fn id(&self, index: usize) -> &'a DeviceId {
        self.pools.id(self.alloc, index)
    }

    pub fn device(&self, index: usize) -> &'a Device {
        let c = self.candidate(index);
        &self.alloc.slices[c.slice]
            .spec
            .devices
            .as_deref()
            .unwrap_or(&[])[c.device]
    }

    fn capacities(&self, index: usize) -> Result<&'a [CapacityDef], String> {
        let c = self.candidate(index);
        self.alloc.capacities(c.slot, c.slice, c.device)
    }

    /// Validates all claims and resolves their requests (`Allocate` before the search).
    pub fn prepare(&mut self) -> Result<(), AllocError> {
        let features = self.alloc.features;
        for (ci, claim) in self.claims.iter().enumerate() {
            let obj = kobj(claim);
            let mut min_per_claim: i64 = 0;
            let mut claim_reqs = Vec::new();
            for (ri, request) in requests_of(claim).iter().enumerate() {
                let subs = request.first_available.as_deref().unwrap_or(&[]);
                if !features.prioritized_list && !subs.is_empty() {
                    return Err(AllocError(format!(
                        "claim {obj}, request {}: has subrequests, but the DRAPrioritizedList feature is disabled",
                        request.name
                    )));
                }
                if !features.consumable_capacity {
                    if request
                        .exactly
                        .as_ref()
                        .is_some_and(|e| e.capacity.is_some())
                    {
                        return Err(AllocError(format!(
                            "claim {obj}, request {}: has capacity requests, but the DRAConsumableCapacity feature is disabled",
                            request.name
                        )));
                    }
                    if let Some(s) = subs.iter().find(|s| s.capacity.is_some()) {
                        return Err(AllocError(format!(
                            "claim {obj}, subrequest {}: has capacity requests, but the DRAConsumableCapacity feature is disabled",
                            s.name
                        )));
                    }
                }
                let mut entries = Vec::new();
                let min_devices;
                if !subs.is_empty() {
                    let mut min = i64::MAX;
                    for (si, sub) in subs.iter().enumerate() {
                        let view = RequestView {
                            name: &sub.name,
                            class_name: &sub.device_class_name,
                            mode: sub.allocation_mode.as_deref(),
                            count: sub.count,
                            admin: None,
                            selectors: sub.selectors.as_deref().unwrap_or(&[]),
                            tolerations: sub.tolerations.as_ref(),
                            capacity: sub.capacity.as_ref(),
                            derived_attributes: sub.derived_attributes.as_ref(),
                        };
                        let req = self.validate(ci, ri, si, view, Some(&request.name))?;
                        min = min.min(req.num_devices);
                        entries.push(req);
                    }
                    min_devices = min;
                } else {
                    let exactly = request.exactly.as_ref();
                    let view = RequestView {
                        name: &request.name,
                        class_name: exactly.map_or("", |e| e.device_class_name.as_str()),
                        mode: exactly.and_then(|e| e.allocation_mode.as_deref()),
                        count: exactly.and_then(|e| e.count),
                        admin: exactly.and_then(|e| e.admin_access),
                        selectors: exactly.and_then(|e| e.selectors.as_deref()).unwrap_or(&[]),
                        tolerations: exactly.and_then(|e| e.tolerations.as_ref()),
                        capacity: exactly.and_then(|e| e.capacity.as_ref()),
                        derived_attributes: exactly.and_then(|e| e.derived_attributes.as_ref()),
                    };
                    let req = self.validate(ci, ri, 0, view, None)?;
                    min_devices = req.num_devices;
                    entries.push(req);
                }
                if min_devices > MAX_RESULTS_PER_CLAIM - min_per_claim {
                    return Err(AllocError(format!(
                        "claim {obj}, request {}: adding {min_devices} devices exceeds the claim limit of {MAX_RESULTS_PER_CLAIM}, with {min_per_claim} already accounted for",
                        request.name
                    )));
                }
                min_per_claim += min_devices;
                claim_reqs.push(entries);
            }
            self.reqs.push(claim_reqs);
            self.selected_sub.push(vec![0; requests_of(claim).len()]);

            let mut constraints = Vec::new();
            for (i, c) in super::device_claim(claim)
                .and_then(|d| d.constraints.as_deref())
                .unwrap_or(&[])
                .iter()
                .enumerate()
            {
                let requests = c.requests.iter().flatten().map(String::as_str).collect();
                let list = features.list_type_attributes;
                let constraint = if let Some(attr) = &c.match_attribute {
                    Constraint::new(false, requests, attr, list)
                } else if let Some(attr) = &c.distinct_attribute {
                    Constraint::new(true, requests, attr, list)
                } else {
                    return Err(AllocError(format!(
                        "claim {obj}, constraint #{i}: empty constraint (unsupported constraint type?)"
                    )));
                };
                constraints.push(constraint);
            }
            self.constraints.push(constraints);
        }
        Ok(())
    }

    /// `validateDeviceRequest`.
    fn validate(
        &mut self,
        claim: usize,
        request: usize,
        sub: usize,
        view: RequestView<'a>,
        parent: Option<&'a str>,
    ) -> Result<Req<'a>, AllocError> {
        let features = self.alloc.features;
        let obj = kobj(&self.claims[claim]);
        let name = view.name;
        let derives = view.derived_attributes.is_some_and(|d| !d.is_empty());
        if derives && !features.derived_attributes {
            return Err(AllocError(format!(
                "claim {obj}, request {name}: cannot handle request with derived attributes, the feature is disabled"
            )));
        }
        let mut selectors = Vec::new();
        for (i, s) in view.selectors.iter().enumerate() {
            match &s.cel {
                Some(cel) => selectors.push(self.alloc.selector_id(&cel.expression)),
                None => {
                    return Err(AllocError(format!(
                        "claim {obj}, request {name}, selector #{i}: CEL expression empty (unsupported selector type?)"
                    )));
                }
            }
        }
        if !features.admin_access && view.admin.is_some() {
            return Err(AllocError(format!(
                "claim {obj}, request {name}: admin access is requested, but the feature is disabled"
            )));
        }
        if view.class_name.is_empty() {
            return Err(AllocError(format!(
                "claim {obj}, request {name}: missing device class name (unsupported request type?)"
            )));
        }
        let Some(class) = self.alloc.class(view.class_name) else {
            return Err(AllocError(format!(
                "claim {obj}, request {name}: could not retrieve device class {0}: deviceclasses.resource.k8s.io \"{0}\" not found",
                view.class_name
            )));
        };
        let class_selectors = class
            .spec
            .iter()
            .flat_map(|s| s.selectors.iter().flatten())
            .map(|s| {
                s.cel
                    .as_ref()
                    .map(|c| self.alloc.selector_id(&c.expression))
            })
            .collect();
        let capacity = match view.capacity.and_then(|c| c.requests.as_ref()) {
            None => None,
            Some(requests) => Some(
                requests
                    .iter()
                    .map(|(k, q)| Amount::parse(&q.0).map(|a| (k.clone(), a)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        AllocError(format!("claim {obj}, request {name}: capacity: {e}"))
                    })?,
            ),
        };
        let mode = view.mode.filter(|m| !m.is_empty()).unwrap_or("ExactCount");
        let flat = {
            let mut memo = self.memo.borrow_mut();
            memo.push(vec![0; self.pools.candidates.len()]);
            memo.len() - 1
        };
        let mut req = Req {
            name,
            parent,
            class: Some(class),
            class_selectors,
            selectors,
            all_mode: mode == "All",
            num_devices: 0,
            admin: view.admin.unwrap_or(false),
            tolerations: defaulted_tolerations(view.tolerations),
            capacity,
            all_devices: Vec::new(),
            flat,
            derived: self.derived.of(view.derived_attributes),
        };
        match mode {
            "ExactCount" => {
                req.num_devices = match view.count {
                    None | Some(0) => 1,
                    Some(n) => n,
                };
            }
            "All" => {
                for (pi, pool) in self.pools.pools.iter().enumerate() {
                    if pool.incomplete {
                        return Err(AllocError(format!(
                            "claim {obj}, request {name}: asks for all devices, but resource pool {} is currently being updated",
                            pool.id()
                        )));
                    }
                    if pool.invalid.is_some() {
                        return Err(AllocError(format!(
                            "claim {obj}, request {name}: asks for all devices, but resource pool {} is currently invalid",
                            pool.id()
                        )));
                    }
                    for index in 0..self.pools.candidates.len() {
                        if self.pools.candidates[index].pool != pi {
                            continue;
                        }
                        if !self.is_selectable(claim, &req, index).map_err(AllocError)? {
                            continue;
                        }
                        if features.consumable_capacity {
                            // Static capacity only: what is in use is checked when allocating.
                            let caps = self.capacities(index).map_err(AllocError)?;
                            let fits = capacity::request_fits(
                                None,
                                req.capacity.as_deref(),
                                caps,
                                None,
                                features.fractional_capacity_range,
                            )
                            .map_err(|e| {
                                AllocError(format!(
                                    "claim {obj}, request {name}: checking capacity for device {}: {e}",
                                    self.device(index).name
                                ))
                            })?;
                            if !fits {
                                continue;
                            }
                        }
                        req.all_devices.push(index);
                    }
                }
                req.num_devices = req.all_devices.len() as i64;
            }
            other => {
                return Err(AllocError(format!(
                    "claim {obj}, request {name}: unsupported count mode {other}"
                )));
            }
        }
        let _ = (request, sub);
        Ok(req)
    }

    /// `isSelectable`: class selectors, then request selectors, then per-device node
    /// selection; memoized per request and device.
    pub fn is_selectable(&self, claim: usize, req: &Req<'a>, index: usize) -> Result<bool, String> {
        let device = self.device(index);
        if !self.alloc.features.device_binding_and_status
            && device
                .binding_conditions
                .as_ref()
                .is_some_and(|b| !b.is_empty())
        {
            return Ok(false);
        }
        match self.memo.borrow()[req.flat][index] {
            1 => return Ok(false),
            2 => return Ok(true),
            _ => {}
        }
        let verdict = self.check_selectable(claim, req, index)?;
        self.memo.borrow_mut()[req.flat][index] = if verdict { 2 } else { 1 };
        Ok(verdict)
    }

    fn check_selectable(&self, claim: usize, req: &Req<'a>, index: usize) -> Result<bool, String> {
        if let Some(class) = req.class
            && !self.selectors_match(claim, index, Some(class), &req.class_selectors)?
        {
            return Ok(false);
        }
        let request: Vec<Option<usize>> = req.selectors.iter().map(|&s| Some(s)).collect();
        if !self.selectors_match(claim, index, None, &request)? {
            return Ok(false);
        }
        let c = self.candidate(index);
        if self.alloc.slices[c.slice].spec.per_device_node_selection == Some(true) {
            let device = self.device(index);
            return node_matches(
                self.node,
                device.node_name.as_deref().unwrap_or(""),
                device.all_nodes.unwrap_or(false),
                device.node_selector.as_ref(),
            );
        }
        Ok(true)
    }

    /// `selectorsMatch`, with the scheduler's error texts.
    fn selectors_match(
        &self,
        claim: usize,
        index: usize,
        class: Option<&DeviceClass>,
        selectors: &[Option<usize>],
    ) -> Result<bool, String> {
        let c = self.candidate(index);
        let owner = || match class {
            Some(class) => format!("class {}", class.metadata.name.as_deref().unwrap_or("")),
            None => format!("claim {}", kobj(&self.claims[claim])),
        };
        for (i, selector) in selectors.iter().enumerate() {
            let Some(selector) = selector else {
                return Err(format!(
                    "{}: selector #{i}: CEL expression empty (unsupported selector type?)",
                    owner()
                ));
            };
            let result = self
                .alloc
                .evaluate(*selector, c.slot, c.slice, c.device)
                .map_err(|e| format!("convert Device {}: {e}", self.id(index)))?;
            match result {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(CelError::Compile(m)) => {
                    return Err(format!(
                        "{}: selector #{i}: CEL compile error: {m}",
                        owner()
                    ));
                }
                Err(CelError::Runtime(m)) => {
                    return Err(format!(
                        "{}: selector #{i} on device {}: CEL runtime error: {m}",
                        owner(),
                        self.id(index)
                    ));
                }
            }
        }
        Ok(true)
    }

    fn device_in_use(&self, index: usize) -> bool {
        self.allocated_whole[index] || !self.allocating[index].is_empty()
    }

    fn allocating_for_claim(&self, index: usize, claim: usize) -> bool {
        self.allocating[index].contains(&claim)
    }

    fn capacity_in_use(&self, index: usize) -> bool {
        self.shared_in_state[index] || self.allocating_capacity[index].is_some()
    }

    /// `CmpRequestOverCapacity` for the candidate with what is consumed now.
    fn capacity_fits(&self, req: &Req<'a>, index: usize) -> Result<bool, String> {
        let caps = self.capacities(index)?;
        let current = self.current_capacity[index];
        let allocating = self.allocating_capacity[index].as_ref();
        if capacity::trivially_fits(req.capacity.as_deref(), caps, current, allocating) {
            return Ok(true);
        }
        capacity::request_fits(
            current,
            req.capacity.as_deref(),
            caps,
            allocating,
            self.alloc.features.fractional_capacity_range,
        )
    }

    /// `checkAvailableCounters`: reserves the device's counters if they fit.
    fn reserve_counters(&mut self, index: usize) -> Result<bool, String> {
        let pool_index = self.candidate(index).pool;
        if self.available[pool_index].is_none() {
            self.available[pool_index] = Some(self.counters_left(pool_index)?);
        }
        let consumes = self.pools.consumption(self.alloc, index)?;
        for consumption in consumes {
            for (counter, amount) in &consumption.counters {
                let slot = &mut self.consumed_counters[pool_index][consumption.set][*counter];
                *slot = slot.add(amount);
            }
        }
        let Some(available) = &self.available[pool_index] else {
            return Ok(false);
        };
        let fits = available.iter().enumerate().all(|(set, counters)| {
            counters.iter().enumerate().all(|(i, left)| {
                left.cmp_value(&self.consumed_counters[pool_index][set][i])
                    .is_ge()
            })
        });
        if !fits {
            self.release_counters(index);
        }
        Ok(fits)
    }

    fn release_counters(&mut self, index: usize) {
        let pool_index = self.candidate(index).pool;
        // Only called after a successful `consumption` for the same candidate.
        let Ok(consumes) = self.pools.consumption(self.alloc, index) else {
            return;
        };
        for consumption in consumes {
            for (counter, amount) in &consumption.counters {
                let slot = &mut self.consumed_counters[pool_index][consumption.set][*counter];
                *slot = slot.sub(amount);
            }
        }
    }

    /// Whether the allocated state holds the candidate (whole, as a share, or capacity).
    pub fn allocated_in_state(&self, index: usize) -> bool {
        self.allocated_whole[index] || self.shared_in_state[index]
    }

    /// Counters of a pool minus what allocated devices (on this node or not) consume.
    pub fn counters_left(&self, pool_index: usize) -> Result<Vec<Vec<Quantity>>, String> {
        let pool = &self.pools.pools[pool_index];
        let mut left: Vec<Vec<Quantity>> = pool
            .counter_sets
            .iter()
            .map(|s| s.counters.iter().map(|(_, q)| q.clone()).collect())
            .collect();
        let mut take = |consumes: &[super::pools::Consumption]| {
            for consumption in consumes {
                for (counter, amount) in &consumption.counters {
                    let slot = &mut left[consumption.set][*counter];
                    *slot = slot.sub(amount);
                }
            }
        };
        for (index, c) in self.pools.candidates.iter().enumerate() {
            if c.pool == pool_index && self.allocated_in_state(index) {
                take(self.pools.consumption(self.alloc, index)?);
            }
        }
        for (id, consumes) in &pool.other_consumers {
            if self.state.is_allocated(id) {
                take(consumes);
            }
        }
        Ok(left)
    }

    /// `compatibilityGroupsBaselineForPool`: per counter set, the intersection of the groups
    /// of the pool's allocated devices (node's slices first, then the others).
    pub(crate) fn groups_baseline(&self, pool_index: usize) -> HashMap<String, GroupIntersection> {
        let pool = &self.pools.pools[pool_index];
        let mut baseline: HashMap<String, GroupIntersection> = HashMap::new();
        for &slice in pool.slices.iter().chain(&pool.other_slices) {
            for device in self.alloc.slices[slice].spec.devices.iter().flatten() {
                let id = DeviceId::new(&pool.driver, &pool.name, &device.name);
                if !self.state.is_allocated(&id) {
                    continue;
                }
                for c in device.consumes_counters.iter().flatten() {
                    let entry = baseline.entry(c.counter_set.clone()).or_default();
                    *entry = entry.add(&group_set(c));
                }
            }
        }
        baseline
    }

    /// The pool's allocated devices that draw on `counter_set`: whose groups the baseline holds.
    pub(crate) fn counter_set_holders(&self, pool_index: usize, counter_set: &str) -> Vec<String> {
        let pool = &self.pools.pools[pool_index];
        let mut holders = Vec::new();
        for &slice in pool.slices.iter().chain(&pool.other_slices) {
            for device in self.alloc.slices[slice].spec.devices.iter().flatten() {
                let id = DeviceId::new(&pool.driver, &pool.name, &device.name);
                let draws = device
                    .consumes_counters
                    .iter()
                    .flatten()
                    .any(|c| c.counter_set == counter_set);
                if draws && self.state.is_allocated(&id) {
                    holders.push(device.name.clone());
                }
            }
        }
        holders
    }

    /// `checkAndConsumeCompatibilityGroups`: folds the candidate's groups into the running
    /// intersection of every counter set it draws from, or changes nothing and returns None
    /// when one of them does not admit it.
    #[allow(clippy::type_complexity)]
    fn consume_groups(
        &mut self,
        index: usize,
    ) -> Option<Vec<(usize, String, Option<GroupIntersection>)>> {
        let pool_index = self.candidate(index).pool;
        if self.groups_baseline[pool_index].is_none() {
            self.groups_baseline[pool_index] = Some(self.groups_baseline(pool_index));
        }
        let device = self.device(index);
        let mut replaced = Vec::new();
        for c in device.consumes_counters.iter().flatten() {
            let running = &self.groups_running[pool_index];
            let previous = running.get(&c.counter_set).cloned();
            let current = match &previous {
                Some(p) => p.clone(),
                None => self.groups_baseline[pool_index]
                    .as_ref()
                    .and_then(|b| b.get(&c.counter_set))
                    .cloned()
                    .unwrap_or_default(),
            };
            let groups = group_set(c);
            if !current.admits(&groups) {
                self.restore_groups(std::mem::take(&mut replaced));
                return None;
            }
            replaced.push((pool_index, c.counter_set.clone(), previous));
            self.groups_running[pool_index].insert(c.counter_set.clone(), current.add(&groups));
        }
        Some(replaced)
    }

    fn restore_groups(&mut self, replaced: Vec<(usize, String, Option<GroupIntersection>)>) {
        for (pool, set, previous) in replaced.into_iter().rev() {
            match previous {
                Some(p) => {
                    self.groups_running[pool].insert(set, p);
                }
                None => {
                    self.groups_running[pool].remove(&set);
                }
            }
        }
    }

    fn new_share_id(&mut self, claim: usize, index: usize) -> String {
        self.shares_made += 1;
        let claim = &self.claims[claim];
        let seed = format!(
            "{}|{}|{}|{}",
            kobj(claim),
            claim.metadata.uid.as_deref().unwrap_or(""),
            self.id(index),
            self.shares_made
        );
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, seed.as_bytes()).to_string()
    }

    /// `allocateDevice`: takes the candidate for the request if use, counters, taints,
    /// constraints and capacity allow. `must` turns a constraint conflict into an error.
    fn allocate_device(&mut self, at: At, index: usize, must: bool) -> Result<Option<Undo>, Halt> {
        let features = self.alloc.features;
        let device = self.device(index);
        let claim = at.claim;
        let (admin, name, parent) = {
            let req = &self.reqs[claim][at.request][at.sub];
            (req.admin, req.name, req.parent)
        };
        let allow_multiple =
            features.consumable_capacity && device.allow_multiple_allocations == Some(true);
        if !allow_multiple && admin && self.allocating_for_claim(index, claim) {
            return Ok(None);
        }
        if !admin && self.device_in_use(index) {
            return Ok(None);
        }
        // Only the experimental allocator knows about optional node operations; it hands
        // out such devices only with the feature on and on nodes declaring it.
        if features.experimental() {
            let c = self.candidate(index);
            let skips = self.alloc.slices[c.slice]
                .spec
                .skip_node_operations
                .as_ref()
                .is_some_and(|s| !s.is_empty());
            if skips
                && (!features.optional_node_operations
                    || !self
                        .node
                        .declared_features
                        .iter()
                        .any(|f| f == OPTIONAL_NODE_OPERATIONS))
            {
                return Ok(None);
            }
        }
        let consumes = device
            .consumes_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty());
        if !features.partitionable_devices && consumes {
            return Ok(None);
        }
        // A further share of an allow-multiple device must not charge its counters again.
        let skip_counters = allow_multiple && self.capacity_in_use(index);
        let mut undo = Undo {
            candidate: index,
            claim,
            request: at.request,
            sub: at.sub,
            counters_reserved: false,
            groups_replaced: Vec::new(),
            constraints_added: 0,
            marked: false,
            capacity_inserted: None,
            capacity_existed: false,
            previous_results: self.results[claim].len(),
        };
        // Checked before the counters, so a rejection has nothing to undo yet.
        if features.compatibility_groups && !skip_counters && consumes {
            match self.consume_groups(index) {
                Some(replaced) => undo.groups_replaced = replaced,
                None => return Ok(None),
            }
        }
        if !skip_counters && consumes {
            match self.reserve_counters(index) {
                Ok(true) => undo.counters_reserved = true,
                Ok(false) => {
                    self.rollback(undo);
                    return Ok(None);
                }
                Err(e) => {
                    self.rollback(undo);
                    return Err(Halt::Fatal(e));
                }
            }
        }
        if features.device_taints {
            let req = &self.reqs[claim][at.request][at.sub];
            if blocking_taint(device, &req.tolerations).is_some() {
                self.rollback(undo);
                return Ok(None);
            }
        }
        let (base, sub) = match parent {
            Some(p) => (p, Some(name)),
            None => (name, None),
        };
        let driver = &self.pools.pools[self.candidate(index).pool].driver;
        for i in 0..self.constraints[claim].len() {
            // Only a constraint that applies to the request looks at the attribute (a derived
            // one may fail to evaluate, and then the allocation fails).
            let attribute = if self.constraints[claim][i].applies_to(base, sub) {
                let name = self.constraints[claim][i].attribute;
                match self.attribute(claim, at, index, device, driver, name) {
                    Ok(a) => a,
                    Err(e) => {
                        self.rollback(undo);
                        return Err(Halt::Fatal(e));
                    }
                }
            } else {
                None
            };
            if !self.constraints[claim][i].add(base, sub, attribute) {
                self.rollback(undo);
                if must {
                    return Err(Halt::Fatal(format!(
                        "claim {}, request {name}: cannot add device {} because a claim constraint would not be satisfied",
                        kobj(&self.claims[claim]),
                        self.id(index)
                    )));
                }
                return Ok(None);
            }
            undo.constraints_added += 1;
        }
        if !allow_multiple {
            self.allocating[index].push(claim);
            undo.marked = true;
        }
        let mut consumed = None;
        let mut share_id = None;
        if features.consumable_capacity {
            let fits = {
                let req = &self.reqs[claim][at.request][at.sub];
                self.capacity_fits(req, index)
            };
            match fits {
                Err(e) => {
                    self.rollback(undo);
                    return Err(self.device_error(
                        claim,
                        name,
                        "rechecking capacity for",
                        index,
                        &e,
                    ));
                }
                Ok(false) => {
                    self.rollback(undo);
                    return Ok(None);
                }
                Ok(true) => {}
            }
            if allow_multiple {
                let taken = self.capacities(index).and_then(|caps| {
                    let req = &self.reqs[claim][at.request][at.sub];
                    capacity::consumed_by_request(
                        req.capacity.as_deref(),
                        caps,
                        features.fractional_capacity_range,
                    )
                });
                let taken = match taken {
                    Ok(t) => t,
                    Err(e) => {
                        self.rollback(undo);
                        let what = "computing consumed capacity for";
                        return Err(self.device_error(claim, name, what, index, &e));
                    }
                };
                share_id = Some(self.new_share_id(claim, index));
                undo.capacity_existed = self.allocating_capacity[index].is_some();
                let entry = self.allocating_capacity[index].get_or_insert_with(Default::default);
                for (cap, amount) in &taken {
                    let sum = match entry.get(cap) {
                        Some(prev) => prev.add(&amount.value),
                        None => amount.value.clone(),
                    };
                    entry.insert(cap.clone(), sum);
                }
                undo.capacity_inserted = Some(
                    taken
                        .iter()
                        .map(|(n, a)| (n.clone(), a.value.clone()))
                        .collect(),
                );
                consumed = Some(taken).filter(|t| !t.is_empty());
            }
        }
        self.results[claim].push(Pick {
            request: at.request,
            sub: at.sub,
            candidate: index,
            share_id,
            consumed,
        });
        Ok(Some(undo))
    }

    /// A fatal error about one device, in the scheduler's words.
    fn device_error(&self, claim: usize, request: &str, what: &str, index: usize, e: &str) -> Halt {
        Halt::Fatal(format!(
            "claim {}, request {request}: {what} device {}: {e}",
            kobj(&self.claims[claim]),
            self.id(index)
        ))
    }

    /// Reverses what `allocate_device` did, newest change first.
    fn rollback(&mut self, undo: Undo) {
        let index = undo.candidate;
        self.results[undo.claim].truncate(undo.previous_results);
        if let Some(taken) = &undo.capacity_inserted {
            if let Some(entry) = &mut self.allocating_capacity[index] {
                for (cap, amount) in taken {
                    if let Some(prev) = entry.get(cap) {
                        let left = prev.sub(amount);
                        entry.insert(cap.clone(), left);
                    }
                }
                if entry.values().all(|q| q.sign() == 0) {
                    self.allocating_capacity[index] = None;
                }
            }
            // An earlier share still needs the entry as its "shared" marker.
            if undo.capacity_existed && self.allocating_capacity[index].is_none() {
                self.allocating_capacity[index] = Some(Consumed::new());
            }
        }
        if undo.marked
            && let Some(pos) = self.allocating[index].iter().position(|&c| c == undo.claim)
        {
            self.allocating[index].remove(pos);
        }
        let (name, parent) = {
            let req = &self.reqs[undo.claim][undo.request][undo.sub];
            (req.name, req.parent)
        };
        let (base, sub) = match parent {
            Some(p) => (p, Some(name)),
            None => (name, None),
        };
        for i in (0..undo.constraints_added).rev() {
            self.constraints[undo.claim][i].remove(base, sub);
        }
        if undo.counters_reserved {
            self.release_counters(index);
        }
        self.restore_groups(undo.groups_replaced);
    }

    /// `allocateOne`: finds a device for position `at`, then recurses for the next one.
    /// `start` is the first candidate to consider (later devices of the same request never
    /// go back, so each set of devices is tried once, not in every order).
    pub fn allocate_one(&mut self, at: At, in_subrequest: bool, start: usize) -> Step {
        self.steps += 1;
        if self.steps.is_multiple_of(DEADLINE_CHECK_INTERVAL)
            && self.deadline.is_some_and(|d| Instant::now() >= d)
        {
            return Err(Halt::TimedOut);
        }
        if at.claim >= self.claims.len() {
            return Ok(true);
        }
        if at.request >= self.reqs[at.claim].len() {
            let next = At {
                claim: at.claim + 1,
                ..At::default()
            };
            return match self.allocate_one(next, false, 0) {
                // Another claim's different choice might leave room: not fatal here.
                Err(Halt::MaxSize) => Ok(false),
                other => other,
            };
        }
        let subrequests = self.reqs[at.claim][at.request].len();
        if !in_subrequest && self.reqs[at.claim][at.request][0].parent.is_some() {
            let mut all_exceeded = true;
            for sub in 0..subrequests {
                let step = self.allocate_one(At { sub, ..at }, true, 0);
                match step {
                    Err(Halt::MaxSize) => continue,
                    Err(e) => return Err(e),
                    Ok(true) => {
                        self.selected_sub[at.claim][at.request] = sub;
                        return Ok(true);
                    }
                    Ok(false) => all_exceeded = false,
                }
            }
            return if all_exceeded {
                Err(Halt::MaxSize)
            } else {
                Ok(false)
            };
        }

        let (all_mode, num_devices, admin, all_len) = {
            let req = &self.reqs[at.claim][at.request][at.sub];
            (
                req.all_mode,
                req.num_devices,
                req.admin,
                req.all_devices.len(),
            )
        };
        if all_mode && all_len == 0 {
            return Ok(false);
        }
        if at.device >= num_devices {
            let next = At {
                claim: at.claim,
                request: at.request + 1,
                ..At::default()
            };
            return self.allocate_one(next, false, 0);
        }
        let remaining = num_devices - at.device;
        let room = MAX_RESULTS_PER_CLAIM - self.results[at.claim].len() as i64;
        if remaining > room {
            return Err(Halt::MaxSize);
        }
        let next_device = At {
            device: at.device + 1,
            ..at
        };

        if all_mode {
            // "All" devices are known already; the order does not matter, one try only.
            let index = self.reqs[at.claim][at.request][at.sub].all_devices[at.device as usize];
            let Some(undo) = self.allocate_device(at, index, true)? else {
                return Ok(false);
            };
            let step = self.allocate_one(next_device, in_subrequest, 0);
            if !matches!(step, Ok(true)) {
                self.rollback(undo);
            }
            return step;
        }

        let consumable = self.alloc.features.consumable_capacity;
        for index in start..self.pools.candidates.len() {
            if admin {
                if self.allocating_for_claim(index, at.claim) {
                    continue;
                }
            } else if self.device_in_use(index) {
                continue;
            }
            let selectable = {
                let req = &self.reqs[at.claim][at.request][at.sub];
                self.is_selectable(at.claim, req, index)
            };
            if !selectable.map_err(Halt::Fatal)? {
                continue;
            }
            if consumable {
                let fits = {
                    let req = &self.reqs[at.claim][at.request][at.sub];
                    self.capacity_fits(req, index)
                };
                match fits {
                    Err(e) => {
                        let name = self.reqs[at.claim][at.request][at.sub].name;
                        let what = "checking capacity for";
                        return Err(self.device_error(at.claim, name, what, index, &e));
                    }
                    Ok(false) => continue,
                    Ok(true) => {}
                }
            }
            let Some(undo) = self.allocate_device(at, index, false)? else {
                continue;
            };
            let step = self.allocate_one(next_device, in_subrequest, index + 1);
            if matches!(step, Ok(true)) {
                return step;
            }
            self.rollback(undo);
            step?;
        }
        Ok(false)
    }
}

/// `Allocate`: validate, search, and build the results.
pub(crate) fn allocate(
    alloc: &Allocator,
    pools: &NodePools,
    node: &NodeInfo,
    claims: &[ResourceClaim],
    state: &AllocatedState,
) -> Result<Outcome, AllocError> {
    let derived = DerivedValues::new(alloc, pools, claims);
    let mut run = Run::new(alloc, pools, &derived, node, claims, state);
    run.prepare()?;
    let searched = run.allocate_one(At::default(), false, 0);
    alloc.count_allocate_one_invocations(run.steps);
    match searched {
        Err(Halt::Fatal(m)) => Err(AllocError(m)),
        Err(Halt::MaxSize) => Err(AllocError("allocation max size exceeded".to_string())),
        Err(Halt::TimedOut) => Err(AllocError(format!(
            "node {}: timed out trying to allocate devices",
            node.name
        ))),
        Ok(false) => {
            let invalid = pools.pools.iter().any(|p| p.invalid.is_some());
            Ok(Outcome::Unsatisfiable {
                reason: invalid.then(|| "invalid resource pools were encountered".to_string()),
            })
        }
        Ok(true) => super::result::build(&run).map(Outcome::Allocated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kubernetes' own cases (`TestTolerationToleratesTaint`, resourceclaim v0.37.2).
    #[test]
    fn tolerations_follow_kubernetes() {
        let toleration = |key: &str, operator: &str, value: &str, effect: &str| DeviceToleration {
            key: Some(key.into()),
            operator: Some(operator.into()),
            value: (!value.is_empty()).then(|| value.into()),
            effect: Some(effect.into()),
            toleration_seconds: None,
        };
        let taint = |key: &str, value: &str, effect: &str| DeviceTaint {
            key: key.into(),
            value: (!value.is_empty()).then(|| value.into()),
            effect: effect.into(),
            time_added: None,
        };
        let cases = [
            (
                toleration("foo", "Exists", "", "NoSchedule"),
                taint("foo", "", "NoSchedule"),
                true,
            ),
            (
                toleration("foo", "Exists", "", "NoSchedule"),
                taint("foo", "bar", "NoSchedule"),
                true,
            ),
            (
                toleration("", "Exists", "", "NoSchedule"),
                taint("foo", "bar", "NoSchedule"),
                true,
            ),
            (
                toleration("foo", "Equal", "bar", "NoSchedule"),
                taint("foo", "bar", "NoSchedule"),
                true,
            ),
            (
                toleration("foo", "Equal", "value1", "NoSchedule"),
                taint("foo", "value2", "NoSchedule"),
                false,
            ),
            (
                toleration("foo", "Equal", "bar", "NoSchedule"),
                taint("foo", "bar", "NoExecute"),
                false,
            ),
        ];
        for (i, (toleration, taint, expected)) in cases.iter().enumerate() {
            assert_eq!(
                tolerates(toleration, taint),
                *expected,
                "case {i}: {toleration:?} {taint:?}"
            );
        }
    }
}
