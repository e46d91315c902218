//! "Why is my GPU pod Pending?": the allocation kube-scheduler would make, and for every
//! request and device on the node what kept the device out (the selector clause and the
//! value it saw, use by other claims, capacity, counters, taints, constraints), plus the
//! devices that miss by a single reason.
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use dra_cel::CelError;
use k8s_openapi::api::resource::v1::{
    AllocationResult, Device, DeviceRequest, DeviceSelector, DeviceToleration, ResourceClaim,
};
use regex::Regex;

use super::capacity::{self, Amount};
use super::derived::DerivedValues;
use super::nodesel::node_matches;
use super::search::{
    AttrSet, AttrValue, GroupIntersection, Run, attr_set, attr_value, blocking_taint,
    lookup_attribute,
};
use super::{AllocatedState, Allocator, DeviceId, NodeInfo, Outcome, device_claim, kobj};
use k8s_quantity::Quantity;

/// What the scheduler decided for the claims together.
#[derive(Debug, Clone)]
pub enum Decision {
    Allocated(Vec<AllocationResult>),
    Unsatisfiable(Option<String>),
    /// kube-scheduler aborts the attempt (and retries with backoff) with this error.
    Error(String),
}

/// The reason `allocateDevice` (experimental) refuses every device of a slice with
/// `skipNodeOperations`, if it does.
fn node_operations_problem(run: &Run<'_>, slice: usize) -> Option<Problem> {
    let features = run.alloc.features();
    let skips = run.alloc.slices()[slice]
        .spec
        .skip_node_operations
        .as_ref()
        .filter(|s| !s.is_empty())?;
    if !features.experimental() {
        return None;
    }
    let ops = skips.join(", ");
    if !features.optional_node_operations {
        return Some(Problem::NodeOperations(format!(
            "its slice skips node operations ({ops}), which needs the DRAOptionalNodeOperations feature gate"
        )));
    }
    let declared = run
        .node
        .declared_features
        .iter()
        .any(|f| f == super::OPTIONAL_NODE_OPERATIONS);
    (!declared).then(|| {
        Problem::NodeOperations(format!(
            "its slice skips node operations ({ops}), and the node does not declare {}",
            super::OPTIONAL_NODE_OPERATIONS
        ))
    })
}

/// Why one device was not usable for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    InUse {
        by: Vec<String>,
    },
    /// A class or claim selector was false or failed.
    Selector {
        owner: String,
        index: usize,
        expression: String,
        /// "false", or the error text.
        outcome: String,
        /// Top-level `&&` clauses that were false or failed, with the values they saw.
        clauses: Vec<(String, String)>,
    },
    NotOnNode,
    /// The device's slice lets the node skip operations (`skipNodeOperations`), which the
    /// experimental allocator only allows with DRAOptionalNodeOperations, on nodes declaring it.
    NodeOperations(String),
    Capacity(String),
    /// Shared counters (of the physical GPU) are used up; `held_by` are allocated devices
    /// drawing on the same counter sets.
    Counters {
        detail: String,
        held_by: Vec<String>,
    },
    Taint(String),
    /// Devices sharing a counter set (a GPU) must share a compatibility group
    /// (DRADeviceCompatibilityGroups); the allocated `held_by` leave none this device is in.
    Compatibility {
        counter_set: String,
        device_groups: Vec<String>,
        allowed: String,
        held_by: Vec<String>,
    },
}

impl Problem {
    /// Whether fixing this one thing is a small change (one clause, one holder).
    fn is_single(&self) -> bool {
        match self {
            Problem::Selector { clauses, .. } => clauses.len() == 1,
            _ => true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct DeviceVerdict {
    pub id: DeviceId,
    /// A short description (product name or type) to recognize the device by.
    pub label: String,
    pub problems: Vec<Problem>,
    pub chosen: bool,
    /// Selectors rule the device out, and it is in use or out of room as well.
    pub also_blocked: bool,
}

#[derive(Debug, Clone)]
pub struct RequestReport {
    /// `req` or `req/sub`.
    pub name: String,
    pub class: String,
    /// "1 device", "3 devices", "all matching devices".
    pub wants: String,
    pub admin: bool,
    pub devices: Vec<DeviceVerdict>,
    /// Set when the request cannot even be evaluated (missing class, bad selector type).
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ClaimReport {
    pub claim: String,
    pub requests: Vec<RequestReport>,
    /// Constraint analysis, one line each.
    pub constraints: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Explanation {
    pub node: String,
    pub decision: Decision,
    pub claims: Vec<ClaimReport>,
    /// Pools the scheduler cannot allocate from on this node, with the reason.
    pub unusable_pools: Vec<String>,
}

/// Explains how `claims` (one pod's) fare on `node` given the devices in use.
pub fn explain(
    alloc: &Allocator,
    node: &NodeInfo,
    claims: &[ResourceClaim],
    state: &AllocatedState,
) -> Explanation {
    let decision = match alloc.allocate(node, claims, state) {
        Ok(Outcome::Allocated(r)) => Decision::Allocated(r),
        Ok(Outcome::Unsatisfiable { reason }) => Decision::Unsatisfiable(reason),
        Err(e) => Decision::Error(e.0),
    };
    let pools = match alloc.node_pools(node) {
        Ok(p) => p,
        Err(e) => {
            return Explanation {
                node: node.name.clone(),
                decision: Decision::Error(e.0),
                claims: Vec::new(),
                unusable_pools: Vec::new(),
            };
        }
    };
    let unusable_pools = pools
        .pools
        .iter()
        .filter_map(|p| {
            if p.incomplete {
                Some(format!("{}: incomplete (slices are being updated)", p.id()))
            } else {
                p.invalid
                    .as_ref()
                    .map(|r| format!("{}: invalid: {r}", p.id()))
            }
        })
        .collect();
    let derived = DerivedValues::new(alloc, &pools, claims);
    let run = Run::new(alloc, &pools, &derived, node, claims, state);
    // Per pool and counter set, what the allocated devices' compatibility groups allow: the
    // same for every device and request, so worked out once.
    let baselines: Vec<GroupBaseline> = if alloc.features().compatibility_groups {
        (0..pools.pools.len())
            .map(|p| run.groups_baseline(p))
            .collect()
    } else {
        Vec::new()
    };
    let mut reports = Vec::new();
    for (ci, claim) in claims.iter().enumerate() {
        let chosen: Vec<(String, DeviceId)> = match &decision {
            Decision::Allocated(results) => results
                .get(ci)
                .and_then(|r| r.devices.as_ref())
                .and_then(|d| d.results.as_ref())
                .into_iter()
                .flatten()
                .map(|r| {
                    (
                        r.request.clone(),
                        DeviceId::new(&r.driver, &r.pool, &r.device),
                    )
                })
                .collect(),
            _ => Vec::new(),
        };
        reports.push(explain_claim(&run, &baselines, claim, &chosen));
    }
    Explanation {
        node: node.name.clone(),
        decision,
        claims: reports,
        unusable_pools,
    }
}

/// The parts of an exact request or subrequest that decide eligibility.
struct Wanted<'a> {
    name: String,
    class: &'a str,
    mode: &'a str,
    count: i64,
    admin: bool,
    selectors: &'a [DeviceSelector],
    tolerations: Vec<DeviceToleration>,
    capacity: Option<Vec<(String, Amount)>>,
}

fn wanted_of(request: &DeviceRequest) -> Vec<Wanted<'_>> {
    let capacity = |c: Option<&k8s_openapi::api::resource::v1::CapacityRequirements>| {
        c.and_then(|c| c.requests.as_ref()).map(|r| {
            r.iter()
                .filter_map(|(k, q)| Amount::parse(&q.0).ok().map(|a| (k.clone(), a)))
                .collect()
        })
    };
    let tolerations = |t: Option<&Vec<DeviceToleration>>| -> Vec<DeviceToleration> {
        t.into_iter()
            .flatten()
            .map(|t| {
                let mut t = t.clone();
                t.operator.get_or_insert_with(|| "Equal".to_string());
                t
            })
            .collect()
    };
    if let Some(subs) = request.first_available.as_ref().filter(|s| !s.is_empty()) {
        return subs
            .iter()
            .map(|s| Wanted {
                name: format!("{}/{}", request.name, s.name),
                class: &s.device_class_name,
                mode: s.allocation_mode.as_deref().unwrap_or("ExactCount"),
                count: s.count.filter(|&c| c > 0).unwrap_or(1),
                admin: false,
                selectors: s.selectors.as_deref().unwrap_or(&[]),
                tolerations: tolerations(s.tolerations.as_ref()),
                capacity: capacity(s.capacity.as_ref()),
            })
            .collect();
    }
    let e = request.exactly.as_ref();
    vec![Wanted {
        name: request.name.clone(),
        class: e.map_or("", |e| e.device_class_name.as_str()),
        mode: e
            .and_then(|e| e.allocation_mode.as_deref())
            .unwrap_or("ExactCount"),
        count: e.and_then(|e| e.count).filter(|&c| c > 0).unwrap_or(1),
        admin: e.and_then(|e| e.admin_access).unwrap_or(false),
        selectors: e.and_then(|e| e.selectors.as_deref()).unwrap_or(&[]),
        tolerations: tolerations(e.and_then(|e| e.tolerations.as_ref())),
        capacity: capacity(e.and_then(|e| e.capacity.as_ref())),
    }]
}

fn explain_claim(
    run: &Run<'_>,
    baselines: &[GroupBaseline],
    claim: &ResourceClaim,
    chosen: &[(String, DeviceId)],
) -> ClaimReport {
    let alloc = run.alloc;
    let mut requests = Vec::new();
    for request in device_claim(claim)
        .and_then(|d| d.requests.as_deref())
        .unwrap_or(&[])
    {
        for wanted in wanted_of(request) {
            let wants = if wanted.mode == "All" {
                "all matching devices".to_string()
            } else if wanted.count == 1 {
                "1 device".to_string()
            } else {
                format!("{} devices", wanted.count)
            };
            let mut report = RequestReport {
                name: wanted.name.clone(),
                class: wanted.class.to_string(),
                wants,
                admin: wanted.admin,
                devices: Vec::new(),
                error: None,
            };
            let Some(class) = alloc.class(wanted.class) else {
                report.error = Some(format!("device class {:?} does not exist", wanted.class));
                requests.push(report);
                continue;
            };
            let class_selectors = class
                .spec
                .iter()
                .flat_map(|s| s.selectors.iter().flatten())
                .collect::<Vec<_>>();
            let class_owner = format!("class {}", wanted.class);
            for index in 0..run.pools.candidates.len() {
                let candidate = run.candidate(index);
                let device = run.device(index);
                let mut problems = Vec::new();
                // The scheduler stops at the first class selector that fails; claim selectors
                // never see devices outside the class.
                let outside_class = class_selectors
                    .iter()
                    .enumerate()
                    .find_map(|(i, s)| selector_problem(run, index, &class_owner, i, s));
                if let Some(p) = outside_class {
                    report.devices.push(DeviceVerdict {
                        id: run.id(index).clone(),
                        label: label(device),
                        problems: vec![p],
                        chosen: false,
                        also_blocked: false,
                    });
                    continue;
                }
                let mut selector_problems = Vec::new();
                for (i, s) in wanted.selectors.iter().enumerate() {
                    selector_problems.extend(selector_problem(run, index, "claim selector", i, s));
                }
                if !wanted.admin && run.state.devices.contains(run.id(index)) {
                    let by = run
                        .state
                        .holders
                        .get(run.id(index))
                        .cloned()
                        .unwrap_or_default();
                    problems.push(Problem::InUse { by });
                }
                let spec = &alloc.slices()[candidate.slice].spec;
                if spec.per_device_node_selection == Some(true) {
                    let on_node = node_matches(
                        run.node,
                        device.node_name.as_deref().unwrap_or(""),
                        device.all_nodes.unwrap_or(false),
                        device.node_selector.as_ref(),
                    );
                    if on_node != Ok(true) {
                        problems.push(Problem::NotOnNode);
                    }
                }
                if let Some(p) = node_operations_problem(run, candidate.slice) {
                    problems.push(p);
                }
                if alloc.features().consumable_capacity
                    && let Some(p) = capacity_problem(run, index, wanted.capacity.as_deref())
                {
                    problems.push(p);
                }
                if alloc.features().device_taints
                    && let Some(t) = blocking_taint(device, &wanted.tolerations)
                {
                    problems.push(Problem::Taint(format!(
                        "taint {}{}:{} is not tolerated",
                        t.key,
                        t.value
                            .as_deref()
                            .map(|v| format!("={v}"))
                            .unwrap_or_default(),
                        t.effect
                    )));
                }
                // A device in use holds its own counters; that is not a second reason.
                let in_use = problems.iter().any(|p| matches!(p, Problem::InUse { .. }));
                if !in_use && let Some(p) = counter_problem(run, index) {
                    problems.push(p);
                }
                if !in_use && let Some(p) = compatibility_problem(run, baselines, index) {
                    problems.push(p);
                }
                // A device the selectors rule out is explained by them alone; use, capacity,
                // counters and taints are kept aside to judge whether it is a near miss.
                let (problems, also_blocked) = if selector_problems.is_empty() {
                    (problems, false)
                } else {
                    (selector_problems, !problems.is_empty())
                };
                report.devices.push(DeviceVerdict {
                    id: run.id(index).clone(),
                    label: label(device),
                    chosen: chosen
                        .iter()
                        .any(|(r, id)| r == &wanted.name && id == run.id(index)),
                    problems,
                    also_blocked,
                });
            }
            requests.push(report);
        }
    }
    let constraints = explain_constraints(run, claim, &requests);
    ClaimReport {
        claim: kobj(claim),
        requests,
        constraints,
    }
}

fn label(device: &Device) -> String {
    let attr = |name: &str| {
        device
            .attributes
            .as_ref()
            .and_then(|a| a.get(name))
            .and_then(|a| a.string.clone())
    };
    match (attr("profile"), attr("productName")) {
        (Some(profile), Some(product)) if !product.contains("MIG") => {
            format!("MIG {profile} on {product}")
        }
        (Some(profile), None) => format!("MIG {profile}"),
        (_, Some(product)) => product,
        (None, None) => attr("type").unwrap_or_default(),
    }
}

fn selector_problem(
    run: &Run<'_>,
    index: usize,
    owner: &str,
    i: usize,
    selector: &DeviceSelector,
) -> Option<Problem> {
    let Some(cel) = &selector.cel else {
        return Some(Problem::Selector {
            owner: owner.to_string(),
            index: i,
            expression: String::new(),
            outcome: "no CEL expression".to_string(),
            clauses: Vec::new(),
        });
    };
    let c = run.candidate(index);
    let id = run.alloc.selector_id(&cel.expression);
    let outcome = match run.alloc.evaluate(id, c.slot, c.slice, c.device) {
        Ok(Ok(true)) => return None,
        Ok(Ok(false)) => "false".to_string(),
        Ok(Err(CelError::Compile(m))) => format!("does not compile: {m}"),
        Ok(Err(CelError::Runtime(m))) => format!("error: {m}"),
        Err(m) => format!("error: {m}"),
    };
    Some(Problem::Selector {
        owner: owner.to_string(),
        index: i,
        expression: cel.expression.clone(),
        outcome,
        clauses: failing_clauses(run, index, &cel.expression),
    })
}

/// Splits at top-level `&&` (outside brackets and string literals).
pub fn top_level_clauses(expression: &str) -> Vec<&str> {
    let bytes = expression.as_bytes();
    let mut depth = 0i32;
    let mut quote: Option<u8> = None;
    let mut start = 0;
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = quote {
            if b == b'\\' {
                i += 2;
                continue;
            }
            if b == q {
                quote = None;
            }
        } else {
            match b {
                b'\'' | b'"' => quote = Some(b),
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                b'&' if depth == 0 && bytes.get(i + 1) == Some(&b'&') => {
                    out.push(expression[start..i].trim());
                    start = i + 2;
                    i += 1;
                }
                _ => {}
            }
        }
        i += 1;
    }
    out.push(expression[start..].trim());
    out.retain(|c| !c.is_empty());
    out
}

fn failing_clauses(run: &Run<'_>, index: usize, expression: &str) -> Vec<(String, String)> {
    let clauses = top_level_clauses(expression);
    let c = run.candidate(index);
    let device = run.device(index);
    let mut out = Vec::new();
    for clause in clauses {
        let id = run.alloc.selector_id(clause);
        let verdict = match run.alloc.evaluate(id, c.slot, c.slice, c.device) {
            Ok(Ok(true)) => continue,
            Ok(Ok(false)) => describe_clause(clause, device, &run.id(index).driver),
            Ok(Err(e)) => format!("error: {}", e.message()),
            Err(e) => format!("error: {e}"),
        };
        out.push((clause.to_string(), verdict));
    }
    out
}

fn reference_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r#"device\.(attributes|capacity)\[\s*["']([^"']+)["']\s*\](?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*["']([^"']+)["']\s*\])|device\.(driver|allowMultipleAllocations)"#,
        )
        .expect("static regex")
    })
}

fn comparison_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r#"^\s*(?P<lhs>device\.[^ ]+?)\.(?:compareTo\(\s*quantity\(\s*["'](?P<q>[^"']+)["']\s*\)\s*\)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<n>-?\d+)|(?P<fn>isGreaterThan|isLessThan)\(\s*quantity\(\s*["'](?P<q2>[^"']+)["']\s*\)\s*\))\s*$"#,
        )
        .expect("static regex")
    })
}

/// A value the device has for an attribute or capacity reference, as a person writes it.
fn referenced_value(device: &Device, driver: &str, caps: &regex::Captures<'_>) -> (String, String) {
    if let Some(field) = caps.get(5) {
        let value = match field.as_str() {
            "driver" => format!("'{driver}'"),
            _ => device
                .allow_multiple_allocations
                .unwrap_or(false)
                .to_string(),
        };
        return (field.as_str().to_string(), value);
    }
    let kind = caps.get(1).map_or("", |m| m.as_str());
    let domain = caps.get(2).map_or("", |m| m.as_str());
    let name = caps.get(3).or(caps.get(4)).map_or("", |m| m.as_str());
    let qualified = format!("{domain}/{name}");
    let value = if kind == "capacity" {
        let caps = device.capacity.as_ref();
        let found = caps.and_then(|c| c.get(&qualified)).or_else(|| {
            (domain == driver)
                .then(|| caps.and_then(|c| c.get(name)))
                .flatten()
        });
        found.map_or("missing".to_string(), |c| c.value.0.clone())
    } else {
        match lookup_attribute(device, driver, &qualified).map(attr_value) {
            Some(AttrValue::Str(s)) => format!("'{s}'"),
            Some(AttrValue::Int(i)) => i.to_string(),
            Some(AttrValue::Bool(b)) => b.to_string(),
            Some(AttrValue::Version(v)) => v.to_string(),
            Some(AttrValue::Other) => "a list".to_string(),
            None => "missing".to_string(),
        }
    };
    (name.to_string(), value)
}

/// Why a clause is false, in terms of the device's values: `memory 15Gi < 40Gi`.
fn describe_clause(clause: &str, device: &Device, driver: &str) -> String {
    if let Some(m) = comparison_regex().captures(clause) {
        let lhs = m.name("lhs").map_or("", |x| x.as_str());
        if let Some(r) = reference_regex().captures(lhs) {
            let (name, have) = referenced_value(device, driver, &r);
            let want = m.name("q").or(m.name("q2")).map_or("", |x| x.as_str());
            if let (Ok(h), Ok(w)) = (Quantity::parse(&have), Quantity::parse(want)) {
                let rel = match h.cmp_value(&w) {
                    std::cmp::Ordering::Less => "<",
                    std::cmp::Ordering::Equal => "=",
                    std::cmp::Ordering::Greater => ">",
                };
                return format!("{name} {have} {rel} {want}");
            }
            if have == "missing" {
                return format!("{name} is missing");
            }
        }
    }
    let seen: Vec<String> = reference_regex()
        .captures_iter(clause)
        .map(|r| {
            let (name, value) = referenced_value(device, driver, &r);
            format!("{name} is {value}")
        })
        .collect();
    if seen.is_empty() {
        "false".to_string()
    } else {
        let mut unique = seen;
        unique.dedup();
        unique.join(", ")
    }
}

fn capacity_problem(
    run: &Run<'_>,
    index: usize,
    requests: Option<&[(String, Amount)]>,
) -> Option<Problem> {
    let c = run.candidate(index);
    let caps = match run.alloc.capacities(c.slot, c.slice, c.device) {
        Ok(caps) => caps,
        Err(e) => return Some(Problem::Capacity(e)),
    };
    let current = run.state.consumed_capacity.get(run.id(index));
    let fits = capacity::request_fits(
        current,
        requests,
        caps,
        None,
        run.alloc.features().fractional_capacity_range,
    );
    match fits {
        Ok(true) => None,
        Err(e) => Some(Problem::Capacity(e)),
        Ok(false) => {
            let mut parts = Vec::new();
            for (name, want) in requests.unwrap_or(&[]) {
                match caps.iter().find(|cap| &cap.name == name) {
                    None => parts.push(format!("has no capacity {name}")),
                    Some(cap) => {
                        let used = current.and_then(|u| u.get(name));
                        let used = used.map(|u| format!(", {u} in use")).unwrap_or_default();
                        parts.push(format!(
                            "{name}: requested {}, device has {}{used}",
                            want.text, cap.value.text
                        ));
                    }
                }
            }
            if parts.is_empty() {
                parts.push("capacity already taken by other shares".to_string());
            }
            Some(Problem::Capacity(parts.join("; ")))
        }
    }
}

fn counter_problem(run: &Run<'_>, index: usize) -> Option<Problem> {
    let c = run.candidate(index);
    let consumes = match run.pools.consumption(run.alloc, index) {
        Ok([]) => return None,
        Ok(consumes) => consumes,
        Err(e) => {
            return Some(Problem::Counters {
                detail: e,
                held_by: Vec::new(),
            });
        }
    };
    let pool = &run.pools.pools[c.pool];
    let left = match run.counters_left(c.pool) {
        Ok(left) => left,
        Err(e) => {
            return Some(Problem::Counters {
                detail: e,
                held_by: Vec::new(),
            });
        }
    };
    let mut short = Vec::new();
    let mut sets = Vec::new();
    for consumption in consumes {
        let set = &pool.counter_sets[consumption.set];
        for (counter, amount) in &consumption.counters {
            let have = &left[consumption.set][*counter];
            if have.cmp_value(amount).is_lt() {
                short.push(format!(
                    "{} needs {}, {} left",
                    set.counters[*counter].0,
                    amount_text(amount),
                    amount_text(have)
                ));
                if !sets.contains(&consumption.set) {
                    sets.push(consumption.set);
                }
            }
        }
    }
    if short.is_empty() {
        return None;
    }
    // Who holds the counters: allocated devices drawing on the same counter sets.
    let holders: Vec<&str> = run
        .pools
        .candidates
        .iter()
        .enumerate()
        .filter(|(i, o)| o.pool == c.pool && run.allocated_in_state(*i))
        .filter(|(i, _)| {
            run.pools
                .consumption(run.alloc, *i)
                .is_ok_and(|k| k.iter().any(|k| sets.contains(&k.set)))
        })
        .map(|(i, _)| run.id(i).device.as_str())
        .collect();
    let more = short.len().saturating_sub(3);
    short.truncate(3);
    if more > 0 {
        short.push(format!("{more} more"));
    }
    let set_names: Vec<&str> = sets
        .iter()
        .map(|&i| pool.counter_sets[i].name.as_str())
        .collect();
    Some(Problem::Counters {
        detail: format!("counter set {}: {}", set_names.join(", "), short.join(", ")),
        held_by: holders.into_iter().map(str::to_string).collect(),
    })
}

/// Per counter set of a pool, the compatibility groups its allocated devices leave open.
type GroupBaseline = HashMap<String, GroupIntersection>;

/// Checked as `checkAndConsumeCompatibilityGroups` does, against the devices already
/// allocated (`baselines`, per pool; empty without the feature): the first counter set whose
/// groups leave this device out.
fn compatibility_problem(
    run: &Run<'_>,
    baselines: &[GroupBaseline],
    index: usize,
) -> Option<Problem> {
    if !run.alloc.features().partitionable_devices {
        return None;
    }
    let consumes = run.device(index).consumes_counters.as_ref()?;
    let pool = run.candidate(index).pool;
    let baseline = baselines.get(pool)?;
    consumes.iter().find_map(|c| {
        let current = baseline.get(&c.counter_set)?;
        let groups = super::search::group_set(c);
        (!current.admits(&groups)).then(|| Problem::Compatibility {
            counter_set: c.counter_set.clone(),
            device_groups: groups.into_iter().collect(),
            allowed: current.describe(),
            held_by: run.counter_set_holders(pool, &c.counter_set),
        })
    })
}

/// A counter value for people: bytes in binary units when whole, else as given.
fn amount_text(q: &Quantity) -> String {
    match q.as_int64() {
        Some(v) => capacity::canonical(v, 0, capacity::Format::BinarySI),
        None => q.to_string(),
    }
}

/// The derived attributes of a request (`name`) or subrequest (`name/sub`) of the claim.
fn derived_attributes_of<'c>(
    claim: &'c ResourceClaim,
    name: &str,
) -> Option<&'c Vec<k8s_openapi::api::resource::v1::DeviceDerivedAttribute>> {
    let (base, sub) = match name.split_once('/') {
        Some((base, sub)) => (base, Some(sub)),
        None => (name, None),
    };
    let request = device_claim(claim)?
        .requests
        .iter()
        .flatten()
        .find(|r| r.name == base)?;
    match sub {
        None => request.exactly.as_ref()?.derived_attributes.as_ref(),
        Some(sub) => request
            .first_available
            .iter()
            .flatten()
            .find(|s| s.name == sub)?
            .derived_attributes
            .as_ref(),
    }
}

fn explain_constraints(
    run: &Run<'_>,
    claim: &ResourceClaim,
    requests: &[RequestReport],
) -> Vec<String> {
    let mut out = Vec::new();
    let constraints = device_claim(claim)
        .and_then(|d| d.constraints.as_deref())
        .unwrap_or(&[]);
    for c in constraints {
        let (kind, attribute) = match (&c.match_attribute, &c.distinct_attribute) {
            (Some(a), _) => ("matchAttribute", a),
            (None, Some(a)) => ("distinctAttribute", a),
            _ => continue,
        };
        let names: Vec<&str> = c.requests.iter().flatten().map(String::as_str).collect();
        let applies = |r: &str| {
            names.is_empty()
                || names.contains(&r)
                || r.split_once('/')
                    .is_some_and(|(base, _)| names.contains(&base))
        };
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for report in requests.iter().filter(|r| applies(&r.name)) {
            for d in report.devices.iter().filter(|d| d.problems.is_empty()) {
                let Some(index) = run.pools.find(run.alloc, &d.id) else {
                    continue;
                };
                let device = run.device(index);
                // A derived attribute of the request stands for the device's own.
                let derived = derived_attributes_of(claim, &report.name);
                let found = match run.derived.of(derived).iter().find(|(n, _)| n == attribute) {
                    Some(&(_, expression)) => {
                        match run
                            .derived
                            .value(run.alloc, run.pools, expression, index, attribute)
                        {
                            Ok(a) => Some(a),
                            Err(e) => {
                                let entry = format!("{}:{}", report.name, d.id.device);
                                groups.push((format!("(error: {e})"), vec![entry]));
                                continue;
                            }
                        }
                    }
                    None => lookup_attribute(device, &d.id.driver, attribute),
                };
                let value = match found.map(attr_value) {
                    Some(AttrValue::Str(s)) => format!("'{s}'"),
                    Some(AttrValue::Int(i)) => i.to_string(),
                    Some(AttrValue::Bool(b)) => b.to_string(),
                    Some(AttrValue::Version(v)) => v.to_string(),
                    // With list-type attributes, lists match by common elements.
                    Some(AttrValue::Other) if run.alloc.features().list_type_attributes => found
                        .and_then(attr_set)
                        .map_or("(no value)".to_string(), |set| match set {
                            AttrSet::Int(v) => format!("{v:?}"),
                            AttrSet::Bool(v) => format!("{v:?}"),
                            AttrSet::Str(v) | AttrSet::Version(v) => format!("{v:?}"),
                        }),
                    Some(AttrValue::Other) => "(list: never matches)".to_string(),
                    None => "(missing)".to_string(),
                };
                let entry = format!("{}:{}", report.name, d.id.device);
                match groups.iter_mut().find(|(v, _)| *v == value) {
                    Some((_, list)) => list.push(entry),
                    None => groups.push((value, vec![entry])),
                }
            }
        }
        let scope = if names.is_empty() {
            "all requests".to_string()
        } else {
            format!("requests {}", names.join(", "))
        };
        let mut line = format!("{kind} {attribute} over {scope}: eligible devices by value: ");
        if groups.is_empty() {
            line.push_str("none");
        } else {
            let parts: Vec<String> = groups
                .iter()
                .map(|(v, list)| format!("{v} → {}", list.join(", ")))
                .collect();
            line.push_str(&parts.join("; "));
        }
        out.push(line);
    }
    out
}

fn describe_problem(p: &Problem) -> String {
    match p {
        Problem::InUse { by } if by.is_empty() => "already allocated to another claim".to_string(),
        Problem::InUse { by } => format!("already allocated to {}", by.join(", ")),
        Problem::Selector {
            owner,
            index,
            expression,
            outcome,
            clauses,
        } => {
            let who = if owner.starts_with("class") {
                format!("{owner} selector #{index}")
            } else {
                format!("{owner} #{index}")
            };
            if clauses.is_empty() || outcome.starts_with("does not compile") {
                return format!("{who} `{expression}` is {outcome}");
            }
            let parts: Vec<String> = clauses
                .iter()
                .map(|(clause, why)| {
                    if why.starts_with("error") {
                        format!("`{clause}` fails: {why}")
                    } else {
                        format!("{why} (`{clause}`)")
                    }
                })
                .collect();
            if outcome == "false" {
                format!("{who}: {}", parts.join("; "))
            } else {
                format!("{who} {outcome}")
            }
        }
        Problem::NotOnNode => "device is not available on this node".to_string(),
        Problem::NodeOperations(s) => s.clone(),
        Problem::Capacity(s) => format!("capacity: {s}"),
        Problem::Counters { detail, held_by } if held_by.is_empty() => {
            format!("shared counters used up: {detail}")
        }
        Problem::Counters { detail, held_by } => format!(
            "shared counters used up by allocated {}: {detail}",
            held_by.join(", ")
        ),
        Problem::Taint(s) => s.clone(),
        Problem::Compatibility {
            counter_set,
            device_groups,
            allowed,
            held_by,
        } => {
            let mine = if device_groups.is_empty() {
                "has no compatibility group".to_string()
            } else {
                format!("is in group {}", device_groups.join(", "))
            };
            format!(
                "compatibility groups: counter set {counter_set} takes {allowed} next to allocated {}; this device {mine}",
                held_by.join(", ")
            )
        }
    }
}

impl Explanation {
    /// Whether the claims would be allocated.
    pub fn allocated(&self) -> bool {
        matches!(self.decision, Decision::Allocated(_))
    }

    /// The explanation for a person, one device per line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let verdict = match &self.decision {
            Decision::Allocated(_) => "can be allocated".to_string(),
            Decision::Unsatisfiable(None) => {
                "cannot be allocated: the node is filtered out and the pod stays Pending"
                    .to_string()
            }
            Decision::Unsatisfiable(Some(r)) => format!("cannot be allocated: {r}"),
            Decision::Error(e) => format!(
                "cannot be scheduled: kube-scheduler aborts with an error (retried with backoff):\n  {e}"
            ),
        };
        let _ = writeln!(out, "Node {}: {verdict}", self.node);
        for p in &self.unusable_pools {
            let _ = writeln!(out, "  pool {p}: its devices are skipped");
        }
        for claim in &self.claims {
            let _ = writeln!(out, "\nClaim {}:", claim.claim);
            for r in &claim.requests {
                self.render_request(&mut out, r);
            }
            if !claim.constraints.is_empty() {
                let _ = writeln!(out, "  Constraints:");
                for c in &claim.constraints {
                    let _ = writeln!(out, "    {c}");
                }
            }
        }
        out
    }

    fn render_request(&self, out: &mut String, r: &RequestReport) {
        let eligible = r.devices.iter().filter(|d| d.problems.is_empty()).count();
        let admin = if r.admin { ", admin access" } else { "" };
        let _ = writeln!(
            out,
            "  Request {} (class {}{admin}) wants {}: {eligible} of {} devices on the node qualify",
            r.name,
            r.class,
            r.wants,
            r.devices.len()
        );
        if let Some(e) = &r.error {
            let _ = writeln!(out, "    {e}");
            return;
        }
        // Devices with the same reason share a line; the chosen ones and the ones that
        // qualify are listed one by one.
        let mut groups: Vec<(String, Vec<&DeviceVerdict>)> = Vec::new();
        for d in &r.devices {
            let status = if d.chosen {
                "allocated".to_string()
            } else if d.problems.is_empty() {
                match self.decision {
                    Decision::Allocated(_) => "qualifies, not needed".to_string(),
                    _ => "qualifies".to_string(),
                }
            } else {
                let reasons: Vec<String> = d.problems.iter().map(describe_problem).collect();
                format!("passed over: {}", reasons.join("; "))
            };
            let individual = d.chosen || d.problems.is_empty();
            match groups.iter_mut().find(|(s, _)| !individual && *s == status) {
                Some((_, list)) => list.push(d),
                None => groups.push((status, vec![d])),
            }
        }
        for (status, list) in &groups {
            if let [d] = list.as_slice() {
                let label = if d.label.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", d.label)
                };
                let _ = writeln!(out, "    {}{label}: {status}", d.id);
                continue;
            }
            let mut names: Vec<&str> = list.iter().take(4).map(|d| d.id.device.as_str()).collect();
            if list.len() > 4 {
                names.push("...");
            }
            let _ = writeln!(
                out,
                "    {} devices ({}): {status}",
                list.len(),
                names.join(", ")
            );
        }
        if self.allocated() {
            return;
        }
        // Near misses: devices one change away, grouped by the change.
        let mut near: Vec<(String, Vec<String>)> = Vec::new();
        for d in &r.devices {
            let [problem] = d.problems.as_slice() else {
                continue;
            };
            if d.also_blocked || !problem.is_single() {
                continue;
            }
            let (change, detail) = match problem {
                Problem::Selector { owner, .. } if owner.starts_with("class ") => continue,
                Problem::InUse { by } if !by.is_empty() => {
                    (format!("once {} releases it", by.join(", ")), String::new())
                }
                Problem::InUse { .. } => (
                    "once its current claim releases it".to_string(),
                    String::new(),
                ),
                Problem::Selector {
                    owner,
                    index,
                    clauses,
                    ..
                } => {
                    let (clause, why) = &clauses[0];
                    (
                        format!("if {owner} #{index} did not require `{clause}`"),
                        format!(" ({why})"),
                    )
                }
                Problem::Taint(t) => (format!("with a toleration ({t})"), String::new()),
                Problem::Counters { held_by, .. } if !held_by.is_empty() => (
                    format!(
                        "once {} no longer holds the shared counters of its GPU",
                        held_by.join(", ")
                    ),
                    String::new(),
                ),
                Problem::Compatibility { held_by, .. } if !held_by.is_empty() => (
                    format!(
                        "once {} no longer shares its counter set (compatibility groups)",
                        held_by.join(", ")
                    ),
                    String::new(),
                ),
                other => (
                    format!("if not for: {}", describe_problem(other)),
                    String::new(),
                ),
            };
            let entry = format!("{}{detail}", d.id.device);
            match near.iter_mut().find(|(c, _)| *c == change) {
                Some((_, list)) => list.push(entry),
                None => near.push((change, vec![entry])),
            }
        }
        if !near.is_empty() {
            let _ = writeln!(out, "    Would fit instead, with one change:");
            for (change, list) in &near {
                let mut shown: Vec<&str> = list.iter().take(4).map(String::as_str).collect();
                if list.len() > 4 {
                    shown.push("...");
                }
                let _ = writeln!(out, "      {} {change}", shown.join(", "));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clauses_split_at_top_level_only() {
        assert_eq!(
            top_level_clauses("a == 'x&&y' && (b || c && d) && e[\"&&\"]"),
            ["a == 'x&&y'", "(b || c && d)", "e[\"&&\"]"]
        );
    }

    #[test]
    fn quantity_comparisons_read_naturally() {
        let device: Device = serde_json::from_value(serde_json::json!({
            "name": "gpu-0",
            "capacity": {"memory": {"value": "15Gi"}}
        }))
        .unwrap();
        let clause = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0";
        assert_eq!(
            describe_clause(clause, &device, "gpu.nvidia.com"),
            "memory 15Gi < 40Gi"
        );
        let attr = "device.attributes['gpu.nvidia.com'].type == 'gpu'";
        assert_eq!(
            describe_clause(attr, &device, "gpu.nvidia.com"),
            "type is missing"
        );
    }
}
