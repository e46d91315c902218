//! `GatherPools`: which pools have devices for a node, whether each is complete and valid,
//! and the order in which the search visits their devices.
use std::cell::OnceCell;
use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_quantity::Quantity;

use super::nodesel::node_matches;
use super::{AllocError, Allocator, DeviceId, NodeInfo, Slot};

/// One counter set of a pool, counters sorted by name.
#[derive(Debug)]
pub(crate) struct CounterSetDef {
    pub name: String,
    pub counters: Vec<(String, Quantity)>,
}

/// What a device takes from one counter set: (counter index, amount).
#[derive(Debug, Clone)]
pub(crate) struct Consumption {
    pub set: usize,
    pub counters: Vec<(usize, Quantity)>,
}

#[derive(Debug)]
pub(crate) struct Pool {
    pub driver: String,
    pub name: String,
    pub incomplete: bool,
    pub invalid: Option<String>,
    /// Device slices that target the node, sorted by name (slice indexes).
    pub slices: Vec<usize>,
    pub counter_sets: Vec<CounterSetDef>,
    /// Devices of this pool outside the node's slices that consume counters: counted when
    /// allocated, never candidates.
    pub other_consumers: Vec<(DeviceId, Vec<Consumption>)>,
    /// Slices of this pool that do not target the node (`DeviceSlicesNotTargetingNode`):
    /// their allocated devices seed the compatibility-group intersections.
    pub other_slices: Vec<usize>,
}

impl Pool {
    fn unusable(driver: &str, name: &str) -> Self {
        Self {
            driver: driver.to_string(),
            name: name.to_string(),
            incomplete: false,
            invalid: None,
            slices: Vec::new(),
            counter_sets: Vec::new(),
            other_consumers: Vec::new(),
            other_slices: Vec::new(),
        }
    }

    pub fn id(&self) -> String {
        format!("{}/{}", self.driver, self.name)
    }
}

/// One device the search may pick, in search order.
#[derive(Debug)]
pub(crate) struct Candidate {
    pub pool: usize,
    pub slice: usize,
    pub device: usize,
    pub slot: Slot,
    /// Built on first use: most candidates are never named.
    id: OnceCell<DeviceId>,
    /// `consumesCounters` resolved against the pool's counter sets, on first use.
    consumes: OnceCell<Result<Vec<Consumption>, String>>,
}

#[derive(Debug)]
pub(crate) struct NodePools {
    pub pools: Vec<Pool>,
    pub candidates: Vec<Candidate>,
    /// Device id → candidate, built when first needed (to apply an allocated state).
    by_id: OnceCell<HashMap<DeviceId, usize, foldhash::fast::RandomState>>,
}

impl NodePools {
    /// The candidate's driver/pool/device.
    pub fn id(&self, alloc: &Allocator, index: usize) -> &DeviceId {
        let c = &self.candidates[index];
        c.id.get_or_init(|| {
            let pool = &self.pools[c.pool];
            let device = &devices(&alloc.slices[c.slice])[c.device];
            DeviceId::new(&pool.driver, &pool.name, &device.name)
        })
    }

    /// What a candidate takes from its pool's counters.
    pub fn consumption(&self, alloc: &Allocator, index: usize) -> Result<&[Consumption], String> {
        let c = &self.candidates[index];
        let resolved = c.consumes.get_or_init(|| {
            let device = &devices(&alloc.slices[c.slice])[c.device];
            resolve_consumption(&self.pools[c.pool], device).map_err(|e| e.0)
        });
        resolved.as_deref().map_err(Clone::clone)
    }

    /// The candidate with this id, if the node has it.
    pub fn find(&self, alloc: &Allocator, id: &DeviceId) -> Option<usize> {
        // A fleet's allocated devices are mostly other nodes': their pool says so before any
        // hashing (hashing each of them per allocation was most of a fleet match).
        if !self
            .pools
            .iter()
            .any(|p| p.name == id.pool && p.driver == id.driver)
        {
            return None;
        }
        let index = self.by_id.get_or_init(|| {
            (0..self.candidates.len())
                .map(|i| (self.id(alloc, i).clone(), i))
                .collect()
        });
        index.get(id).copied()
    }
}

fn devices(slice: &ResourceSlice) -> &[k8s_openapi::api::resource::v1::Device] {
    slice.spec.devices.as_deref().unwrap_or(&[])
}

fn has_shared_counters(slice: &ResourceSlice) -> bool {
    slice
        .spec
        .shared_counters
        .as_ref()
        .is_some_and(|c| !c.is_empty())
}

fn uses_compatibility_groups(slice: &ResourceSlice) -> bool {
    devices(slice).iter().any(|d| {
        d.consumes_counters.iter().flatten().any(|c| {
            c.compatibility_groups
                .as_ref()
                .is_some_and(|g| !g.is_empty())
        })
    })
}

fn generation(slice: &ResourceSlice) -> i64 {
    slice.spec.pool.generation
}

pub(crate) fn gather(alloc: &Allocator, node: &NodeInfo) -> Result<NodePools, AllocError> {
    let features = alloc.features;
    let slices = &alloc.slices;
    // NewAllocator's split: the node's own slices first, then those without a node name.
    let on_node = slices.iter().enumerate().filter(|(_, s)| {
        s.spec.node_name.as_deref().unwrap_or("") == node.name && !node.name.is_empty()
    });
    let shared = slices
        .iter()
        .enumerate()
        .filter(|(_, s)| s.spec.node_name.as_deref().unwrap_or("").is_empty());

    // Pool id → slices of its newest generation seen so far, in arrival order.
    let mut by_pool: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (index, slice) in on_node.chain(shared) {
        let spec = &slice.spec;
        if !features.partitionable_devices
            && (spec.per_device_node_selection.is_some() || has_shared_counters(slice))
        {
            continue;
        }
        // Without the compatibility-groups feature such slices are ignored (co-allocation
        // cannot be checked), leaving the pool incomplete.
        if !features.compatibility_groups && uses_compatibility_groups(slice) {
            continue;
        }
        let slice_name = slice.metadata.name.as_deref().unwrap_or("");
        let node_name = spec.node_name.as_deref().unwrap_or("");
        let all_nodes = spec.all_nodes.unwrap_or(false);
        let relevant = if !node_name.is_empty() || all_nodes || spec.node_selector.is_some() {
            node_matches(node, node_name, all_nodes, spec.node_selector.as_ref()).map_err(|e| {
                AllocError(format!(
                    "gather pool information: failed to perform node selection for slice {slice_name}: {e}"
                ))
            })?
        } else if spec.per_device_node_selection.unwrap_or(false) {
            let mut any = false;
            for d in devices(slice) {
                let m = node_matches(
                    node,
                    d.node_name.as_deref().unwrap_or(""),
                    d.all_nodes.unwrap_or(false),
                    d.node_selector.as_ref(),
                )
                .map_err(|e| {
                    AllocError(format!(
                        "gather pool information: failed to perform node selection for device {} in slice {slice_name}: {e}",
                        d.name
                    ))
                })?;
                if m {
                    any = true;
                    break;
                }
            }
            any
        } else {
            // Some future node selection we do not know: skip the slice.
            false
        };
        if !relevant {
            continue;
        }
        let key = (spec.driver.clone(), spec.pool.name.clone());
        let entry = by_pool.entry(key).or_default();
        match entry.first().map(|&f| generation(&slices[f])) {
            None => entry.push(index),
            Some(g) if generation(slice) < g => {}
            Some(g) if generation(slice) > g => *entry = vec![index],
            Some(_) => entry.push(index),
        }
    }

    let mut result = Vec::new();
    let mut with_binding_conditions = Vec::new();
    for ((driver, pool_name), pool_slices) in by_pool {
        let first = &slices[pool_slices[0]];
        let wanted = first.spec.pool.resource_slice_count;
        let pool = if pool_slices.len() as i64 == wanted {
            build_pool(alloc, &driver, &pool_slices, None)?
        } else {
            // Look at slices filtered out as irrelevant: the pool may still be complete.
            let mut all = Vec::new();
            let mut obsolete = false;
            for (i, s) in slices.iter().enumerate() {
                if s.spec.driver != driver || s.spec.pool.name != pool_name {
                    continue;
                }
                match generation(s).cmp(&generation(first)) {
                    std::cmp::Ordering::Equal => all.push(i),
                    std::cmp::Ordering::Greater => {
                        obsolete = true;
                        break;
                    }
                    std::cmp::Ordering::Less => {}
                }
            }
            if obsolete {
                continue;
            }
            if !features.compatibility_groups {
                // Consistent with the filter above: ignored slices do not count.
                all.retain(|&i| !uses_compatibility_groups(&slices[i]));
            }
            if all.len() as i64 != wanted {
                let mut p = Pool::unusable(&driver, &pool_name);
                p.incomplete = true;
                result.push(p);
                continue;
            }
            build_pool(alloc, &driver, &pool_slices, Some(&all))?
        };
        let binding = pool.slices.iter().any(|&s| {
            devices(&slices[s])
                .iter()
                .any(|d| d.binding_conditions.is_some())
        });
        if binding {
            with_binding_conditions.push(pool);
        } else {
            result.push(pool);
        }
    }
    // BTreeMap iteration already sorted both lists by (driver, pool).
    result.extend(with_binding_conditions);

    let mut candidates = Vec::new();
    for (pool_index, pool) in result.iter().enumerate() {
        if pool.incomplete || pool.invalid.is_some() {
            continue;
        }
        for &slice_index in &pool.slices {
            for device_index in 0..devices(&slices[slice_index]).len() {
                candidates.push(Candidate {
                    pool: pool_index,
                    slice: slice_index,
                    device: device_index,
                    slot: alloc.slot(slice_index, device_index),
                    id: OnceCell::new(),
                    consumes: OnceCell::new(),
                });
            }
        }
    }
    Ok(NodePools {
        pools: result,
        candidates,
        by_id: OnceCell::new(),
    })
}

fn parse_counter(value: &str) -> Result<Quantity, String> {
    Quantity::parse(value).map_err(|e| format!("{value:?}: {e}"))
}

/// `buildPool`: sorts the node's slices by name, separates counter sets, validates names
/// and counter references. Problems make the pool invalid, not the allocation fail.
fn build_pool(
    alloc: &Allocator,
    driver: &str,
    pool_slices: &[usize],
    all_slices: Option<&[usize]>,
) -> Result<Pool, AllocError> {
    let slices = &alloc.slices;
    let partitionable = alloc.features.partitionable_devices;
    let pool_name = slices[pool_slices[0]].spec.pool.name.clone();
    let mut sorted = pool_slices.to_vec();
    sorted.sort_by(|&a, &b| slices[a].metadata.name.cmp(&slices[b].metadata.name));

    let mut device_slices = Vec::new();
    let mut counter_slices = Vec::new();
    let mut other_slices = Vec::new();
    for &s in &sorted {
        if partitionable && has_shared_counters(&slices[s]) {
            counter_slices.push(s);
        } else {
            device_slices.push(s);
        }
    }
    if let Some(all) = all_slices
        && sorted.len() < all.len()
    {
        let targeting: HashSet<&Option<String>> =
            sorted.iter().map(|&s| &slices[s].metadata.name).collect();
        for &s in all {
            if targeting.contains(&slices[s].metadata.name) {
                continue;
            }
            if partitionable && has_shared_counters(&slices[s]) {
                counter_slices.push(s);
            } else {
                other_slices.push(s);
            }
        }
    }

    let invalid = |reason: String| {
        let mut p = Pool::unusable(driver, &pool_name);
        p.invalid = Some(reason);
        p
    };

    // A set with a fast hash, as Go's validation keeps one: sorting the names to find a
    // duplicate was a tenth of a one-claim allocation.
    let device_count = device_slices
        .iter()
        .map(|&s| devices(&slices[s]).len())
        .sum();
    let mut names: HashSet<&str, foldhash::fast::RandomState> =
        HashSet::with_capacity_and_hasher(device_count, Default::default());
    let mut duplicate = None;
    for d in device_slices.iter().flat_map(|&s| devices(&slices[s])) {
        if !names.insert(d.name.as_str()) {
            // The smallest duplicated name: the message does not depend on slice order.
            duplicate = duplicate
                .min(Some(d.name.as_str()))
                .or(Some(d.name.as_str()));
        }
    }
    if let Some(name) = duplicate {
        return Ok(invalid(format!("duplicate device name {name}")));
    }
    let mut pool = Pool::unusable(driver, &pool_name);
    pool.slices = device_slices.clone();
    if !partitionable {
        return Ok(pool);
    }

    let mut sets: BTreeMap<String, Vec<(String, Quantity)>> = BTreeMap::new();
    for &s in &counter_slices {
        for set in slices[s].spec.shared_counters.iter().flatten() {
            if sets.contains_key(&set.name) {
                return Ok(invalid(format!("duplicate counter set name {}", set.name)));
            }
            let mut counters = Vec::new();
            for (name, counter) in &set.counters {
                let value = parse_counter(&counter.value.0).map_err(|e| {
                    AllocError(format!("counter set {} counter {name}: {e}", set.name))
                })?;
                counters.push((name.clone(), value));
            }
            sets.insert(set.name.clone(), counters);
        }
    }
    for &s in device_slices.iter().chain(&other_slices) {
        for d in devices(&slices[s]) {
            for c in d.consumes_counters.iter().flatten() {
                let Some(set) = sets.get(&c.counter_set) else {
                    return Ok(invalid(format!("counter set {} not found", c.counter_set)));
                };
                // Both are sorted by name (they come from maps): one walk over the set finds
                // them all, where a search per name was a fifth of a one-claim allocation.
                let mut known = set.iter();
                for name in c.counters.keys() {
                    if !known.any(|(n, _)| n == name) {
                        return Ok(invalid(format!(
                            "counter {name} not found in counter set {}",
                            c.counter_set
                        )));
                    }
                }
            }
        }
    }
    pool.counter_sets = sets
        .into_iter()
        .map(|(name, counters)| CounterSetDef { name, counters })
        .collect();
    pool.other_slices = other_slices.clone();
    for &s in &other_slices {
        for d in devices(&slices[s]) {
            let consumes = resolve_consumption(&pool, d)?;
            if !consumes.is_empty() {
                pool.other_consumers
                    .push((DeviceId::new(driver, &pool_name, &d.name), consumes));
            }
        }
    }
    Ok(pool)
}

/// A device's `consumesCounters`, as indexes into the pool's (validated) counter sets.
fn resolve_consumption(
    pool: &Pool,
    device: &k8s_openapi::api::resource::v1::Device,
) -> Result<Vec<Consumption>, AllocError> {
    let mut out = Vec::new();
    for c in device.consumes_counters.iter().flatten() {
        // Counter sets are sorted by name.
        let Ok(set) = pool
            .counter_sets
            .binary_search_by(|s| s.name.as_str().cmp(c.counter_set.as_str()))
        else {
            continue;
        };
        let mut counters = Vec::with_capacity(c.counters.len());
        for (name, counter) in &c.counters {
            let known = &pool.counter_sets[set].counters;
            if let Ok(ci) = known.binary_search_by(|(n, _)| n.as_str().cmp(name.as_str())) {
                let value = parse_counter(&counter.value.0).map_err(|e| {
                    AllocError(format!("device {} counter {name}: {e}", device.name))
                })?;
                counters.push((ci, value));
            }
        }
        out.push(Consumption { set, counters });
    }
    Ok(out)
}
