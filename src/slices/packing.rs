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
//! The driver republishes the order whenever MIG instances come and go.
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

/// Sorts candidates best-fit-first; `usage(minor)` gives each GPU's current use.
pub fn order<'a>(candidates: &mut [Candidate<'a>], usage: impl Fn(&Gpu) -> Usage) {
    let mut keyed: Vec<_> = candidates
        .iter()
        .map(|c| {
            let limits = limits(c.gpu);
            let current = usage(c.gpu);
            let fits = current.fits(&limits, c.profile, c.placement);
            let used = current.used_slices();
            let mut after = current.clone();
            after.add(c.profile, c.placement);
            let room_before = room(c.gpu, &limits, &current);
            let room_after = if fits {
                room(c.gpu, &limits, &after)
            } else {
                0
            };
            let key = (
                !fits,
                used == 0,
                // Fill holes: the placement that takes the least room from other profiles...
                room_before.saturating_sub(room_after),
                // ...on the fullest GPU...
                Reverse(used),
                // ...then one GPU's placements before the next one's, so allocations made before
                // the driver republishes (prepare lags allocation) still pack onto one GPU.
                c.gpu.minor,
                c.placement.start,
                c.profile.id,
            );
            (key, *c)
        })
        .collect();
    keyed.sort_by_key(|(key, _)| *key);
    for (slot, (_, candidate)) in candidates.iter_mut().zip(keyed) {
        *slot = candidate;
    }
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

    fn first_of(gpus: &[Gpu], profile_name: &str, usage: &dyn Fn(&Gpu) -> Usage) -> (u32, u32) {
        let mut candidates: Vec<Candidate> = gpus
            .iter()
            .flat_map(|g| {
                g.mig
                    .iter()
                    .flat_map(|m| m.profiles.iter())
                    .filter(|p| p.name == profile_name)
                    .flat_map(move |p| {
                        p.placements.iter().map(move |pl| Candidate {
                            gpu: g,
                            profile: p,
                            placement: *pl,
                        })
                    })
            })
            .collect();
        order(&mut candidates, usage);
        (candidates[0].gpu.minor, candidates[0].placement.start)
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
