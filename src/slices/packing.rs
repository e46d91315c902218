//! Device order for dynamic MIG. kube-scheduler takes the first matching device in slice order,
//! so the order *is* the placement policy. Published in name order (as NVIDIA's driver does),
//! first-fit fragments GPUs: small slices land on empty GPUs and at low placements, and a later
//! 3g or 7g request finds no whole block (dra-driver-nvidia-gpu #932, #933). Ordering placements
//! best-fit-first avoids that:
//!
//! 1. placements that fit now before those that cannot;
//! 2. partly used GPUs before empty ones (keep whole GPUs whole);
//! 3. the placement that takes the least room from other profiles (room = every placement still
//!    possible, weighted by its size), so small requests fill holes instead of splitting blocks;
//! 4. fuller GPUs first, then by minor and lowest start.
//!
//! The driver republishes the order whenever MIG instances come and go. Until it does, the
//! scheduler keeps taking devices from the same order (prepare lags allocation; a claim's requests
//! are allocated together), so each profile's devices are chained: the next is the best placement
//! once those before it are taken, and a burst fills one GPU instead of opening every empty one.
use std::cmp::Reverse;

use crate::gpu::{GiProfile, Gpu, Placement};

/// What a GPU's existing MIG instances use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub placements: Vec<Placement>,
    /// Engine use per dimension: SM, CE, DEC, ENC, JPEG, OFA, memory MiB.
    pub engines: [u64; 7],
}

fn engines(profile: &GiProfile) -> [u64; 7] {
    [
        u64::from(profile.multiprocessors),
        u64::from(profile.copy_engines),
        u64::from(profile.decoders),
        u64::from(profile.encoders),
        u64::from(profile.jpeg_engines),
        u64::from(profile.ofa_engines),
        profile.memory_mib,
    ]
}

/// The largest use per dimension over all profiles (the GPU's counter values).
pub fn limits(gpu: &Gpu) -> [u64; 7] {
    let mut max = [0; 7];
    for profile in gpu.mig.iter().flat_map(|m| m.profiles.iter()) {
        for (m, e) in max.iter_mut().zip(engines(profile)) {
            *m = (*m).max(e);
        }
    }
    max
}

impl Usage {
    /// Usage of the GPU's existing MIG instances.
    pub fn of(gpu: &Gpu) -> Self {
        let mut usage = Self::default();
        let Some(mig) = &gpu.mig else { return usage };
        for instance in &mig.instances {
            if let Some(profile) = mig.profile_by_id(instance.profile_id) {
                usage.add(profile, instance.placement);
            }
        }
        usage
    }

    pub fn add(&mut self, profile: &GiProfile, placement: Placement) {
        self.placements.push(placement);
        for (u, e) in self.engines.iter_mut().zip(engines(profile)) {
            *u += e;
        }
    }

    pub fn used_slices(&self) -> u32 {
        self.placements.iter().map(|p| p.size).sum()
    }

    /// Whether `profile` at `placement` fits next to this usage.
    pub fn fits(&self, limits: &[u64; 7], profile: &GiProfile, placement: Placement) -> bool {
        !self.placements.iter().any(|p| p.overlaps(&placement))
            && self
                .engines
                .iter()
                .zip(engines(profile))
                .zip(limits)
                .all(|((u, e), l)| u + e <= *l)
    }
}

/// Room left for future requests: every placement of every profile that still fits, weighted by
/// its size, so large blocks count more than small ones.
fn room(gpu: &Gpu, limits: &[u64; 7], usage: &Usage) -> u64 {
    gpu.mig
        .iter()
        .flat_map(|m| m.profiles.iter())
        .flat_map(|profile| profile.placements.iter().map(move |p| (profile, *p)))
        .filter(|(profile, placement)| usage.fits(limits, profile, *placement))
        .map(|(_, placement)| u64::from(placement.size))
        .sum()
}

/// Whether a candidate fits next to its GPU's existing MIG instances (what the pool's counters
/// allow).
pub fn fits_now(candidate: &Candidate) -> bool {
    Usage::of(candidate.gpu).fits(
        &limits(candidate.gpu),
        candidate.profile,
        candidate.placement,
    )
}

/// One placement device to order.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub gpu: &'a Gpu,
    pub profile: &'a GiProfile,
    pub placement: Placement,
}

/// A candidate's rank given its GPU's use (smaller first).
type Key = (bool, bool, u64, Reverse<u32>, u32, u32, u32);

fn key(candidate: &Candidate, current: &Usage) -> Key {
    let limits = limits(candidate.gpu);
    let fits = current.fits(&limits, candidate.profile, candidate.placement);
    let used = current.used_slices();
    let room_before = room(candidate.gpu, &limits, current);
    let room_after = if fits {
        let mut after = current.clone();
        after.add(candidate.profile, candidate.placement);
        room(candidate.gpu, &limits, &after)
    } else {
        0
    };
    (
        !fits,
        used == 0,
        // Fill holes: the placement that takes the least room from other profiles...
        room_before.saturating_sub(room_after),
        // ...on the fullest GPU...
        Reverse(used),
        // ...then by minor and start.
        candidate.gpu.minor,
        candidate.placement.start,
        candidate.profile.id,
    )
}

/// Sorts candidates best-fit-first; `usage(gpu)` gives each GPU's current use.
///
/// The first device of each profile is the best placement now. The scheduler keeps taking
/// devices from this order until the driver republishes (prepare lags allocation, and a claim's
/// several requests are allocated together), so each profile's devices are chained: the next
/// one is the best placement once the ones before it are taken (four 1g requests in a row fill
/// one GPU instead of starting on every empty one). Profiles are then merged by their
/// candidates' rank now, so a request several profiles match still gets the best of them.
pub fn order<'a>(candidates: &mut [Candidate<'a>], usage: impl Fn(&Gpu) -> Usage) {
    let mut now: std::collections::HashMap<u32, Usage> = std::collections::HashMap::new();
    for c in candidates.iter() {
        now.entry(c.gpu.minor).or_insert_with(|| usage(c.gpu));
    }
    let fresh: Vec<Key> = candidates
        .iter()
        .map(|c| key(c, &now[&c.gpu.minor]))
        .collect();
    // Each profile's chain, as indexes into `candidates`.
    let mut by_profile: std::collections::BTreeMap<&str, Vec<usize>> =
        std::collections::BTreeMap::new();
    for (i, c) in candidates.iter().enumerate() {
        by_profile
            .entry(c.profile.name.as_str())
            .or_default()
            .push(i);
    }
    let chains: Vec<Vec<usize>> = by_profile
        .into_values()
        .map(|members| chain(candidates, &members, &now, &fresh))
        .collect();
    // Merge: always the chain head that ranks best now.
    let mut heads = vec![0usize; chains.len()];
    let mut merged = Vec::with_capacity(candidates.len());
    while let Some(next) = (0..chains.len())
        .filter(|&c| heads[c] < chains[c].len())
        .min_by_key(|&c| fresh[chains[c][heads[c]]])
    {
        merged.push(candidates[chains[next][heads[next]]]);
        heads[next] += 1;
    }
    candidates.copy_from_slice(&merged);
}

/// One profile's candidates, each the best once those before it are taken; those that no longer
/// fit then come last, as they rank now.
fn chain(
    candidates: &[Candidate],
    members: &[usize],
    now: &std::collections::HashMap<u32, Usage>,
    fresh: &[Key],
) -> Vec<usize> {
    let mut taken: std::collections::HashMap<u32, Usage> = now.clone();
    let mut remaining: Vec<(Key, usize)> = members.iter().map(|&i| (fresh[i], i)).collect();
    let mut out = Vec::with_capacity(members.len());
    while let Some(best) = (0..remaining.len()).min_by_key(|&r| remaining[r].0) {
        let (best_key, index) = remaining.swap_remove(best);
        if best_key.0 {
            // Nothing left fits beside what the chain took.
            remaining.push((best_key, index));
            remaining.sort_by_key(|&(_, i)| fresh[i]);
            out.extend(remaining.iter().map(|&(_, i)| i));
            break;
        }
        out.push(index);
        let candidate = &candidates[index];
        let minor = candidate.gpu.minor;
        if let Some(use_) = taken.get_mut(&minor) {
            use_.add(candidate.profile, candidate.placement);
        }
        for entry in remaining
            .iter_mut()
            .filter(|(_, i)| candidates[*i].gpu.minor == minor)
        {
            entry.0 = key(&candidates[entry.1], &taken[&minor]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::sim::SimNode;

    fn h100s(n: u32) -> Vec<Gpu> {
        SimNode::new(
            format!("{n}xH100-SXM5-80GB").parse().expect("spec"),
            "n",
            None,
        )
        .inventory()
        .expect("inv")
        .gpus
    }

    /// Every placement of the profiles `wanted` admits on `gpus`.
    fn candidates_of<'a>(
        gpus: &'a [Gpu],
        wanted: &dyn Fn(&GiProfile) -> bool,
    ) -> Vec<Candidate<'a>> {
        gpus.iter()
            .flat_map(|g| {
                g.mig
                    .iter()
                    .flat_map(|m| m.profiles.iter())
                    .filter(|p| wanted(p))
                    .flat_map(move |p| {
                        p.placements.iter().map(move |pl| Candidate {
                            gpu: g,
                            profile: p,
                            placement: *pl,
                        })
                    })
            })
            .collect()
    }

    fn first_of(gpus: &[Gpu], profile_name: &str, usage: &dyn Fn(&Gpu) -> Usage) -> (u32, u32) {
        let mut candidates = candidates_of(gpus, &|p| p.name == profile_name);
        order(&mut candidates, usage);
        (candidates[0].gpu.minor, candidates[0].placement.start)
    }

    /// Every placement of every profile on `gpus`, in published order.
    fn published(gpus: &[Gpu]) -> Vec<Candidate<'_>> {
        let mut candidates = candidates_of(gpus, &|_| true);
        order(&mut candidates, Usage::of);
        candidates
    }

    /// Requests allocated one after another from one published order, as the scheduler does
    /// before the driver republishes: each takes its profile's first device that still fits.
    fn take_in_turn(order: &[Candidate], profiles: &[&str]) -> Vec<(u32, u32)> {
        let mut taken: std::collections::HashMap<u32, Usage> = Default::default();
        profiles
            .iter()
            .map(|name| {
                let c = order
                    .iter()
                    .find(|c| {
                        c.profile.name == *name
                            && taken.get(&c.gpu.minor).cloned().unwrap_or_default().fits(
                                &limits(c.gpu),
                                c.profile,
                                c.placement,
                            )
                    })
                    .expect("a device fits");
                taken
                    .entry(c.gpu.minor)
                    .or_default()
                    .add(c.profile, c.placement);
                (c.gpu.minor, c.placement.start)
            })
            .collect()
    }

    #[test]
    fn requests_before_a_republish_fill_one_gpu() {
        let gpus = h100s(3);
        let order = published(&gpus);
        // Four 1g.20gb in a row fill GPU 0 (two GPUs stay whole for 7g requests)...
        let placed = take_in_turn(&order, &["1g.20gb"; 4]);
        assert!(placed.iter().all(|(minor, _)| *minor == 0), "{placed:?}");
        // ...and a claim of a 1g.20gb and a 3g.40gb (allocated together) gets one GPU.
        let placed = take_in_turn(&order, &["1g.20gb", "3g.40gb"]);
        assert_eq!(placed[0].0, placed[1].0, "{placed:?}");
        // Each profile's first device is still the best placement now.
        assert_eq!(take_in_turn(&order, &["3g.40gb"]), [(0, 4)]);
        assert_eq!(take_in_turn(&order, &["1g.10gb"]), [(0, 6)]);
    }

    #[test]
    fn small_slices_go_high_and_keep_the_big_blocks() {
        let gpus = h100s(2);
        let empty = |_: &Gpu| Usage::default();
        // 1g goes to the top slot of GPU 0: 4g@0 and 2g@4 stay possible.
        assert_eq!(first_of(&gpus, "1g.10gb", &empty), (0, 6));
        // 3g goes to the upper half, keeping 4g@0.
        assert_eq!(first_of(&gpus, "3g.40gb", &empty), (0, 4));
        assert_eq!(first_of(&gpus, "2g.20gb", &empty), (0, 4));
    }

    #[test]
    fn partly_used_gpus_fill_first() {
        let gpus = h100s(3);
        let one_g = gpus[2]
            .mig
            .as_ref()
            .expect("mig")
            .profiles
            .iter()
            .find(|p| p.name == "1g.10gb")
            .expect("1g")
            .clone();
        let usage = move |g: &Gpu| {
            let mut u = Usage::default();
            if g.minor == 2 {
                u.add(&one_g, Placement { start: 6, size: 1 });
            }
            u
        };
        // GPU 2 already has a 1g: the next 1g and the next 3g go there, not to an empty GPU.
        assert_eq!(first_of(&gpus, "1g.10gb", &usage), (2, 4));
        assert_eq!(first_of(&gpus, "3g.40gb", &usage), (2, 0));
        // A 7g cannot fit on GPU 2 any more.
        assert_eq!(first_of(&gpus, "7g.80gb", &usage), (0, 0));
    }
}
