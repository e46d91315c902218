//! A second floor on the best order's failures, in the continuous-time model of
//! [`super::many`]: the node whose live instances are re-placed freely (any GPU, any start)
//! before every arrival, and which may also turn away a request that fits. Every device order's
//! run is one of this node's runs (place what the order placed, turn away what failed), so the
//! fewest failures this node can have is no more than the best order's. Its state is only how
//! many instances of each profile are live (a few hundred thousand states on 8×H100 with the
//! default mix), so it is solved by relative value iteration; whatever the iterations, the least
//! of the Bellman residual over all states is a valid floor.
//!
//! It sees capacity, not fragmentation: it is close to the best order at heavy load, where
//! requests fail for want of room, and far below it at light load, where they fail because the
//! room is scattered; [`super::bound`] is the reverse.
use std::collections::{HashMap, HashSet};

use super::super::packing_study::Wanted;
use super::bound::BoundError;
use super::{Gpus, Held};
use gpu_dra::gpu::Gpu;

/// The floor and what it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Repacked {
    /// No device order fails fewer arrivals than this, in the long run.
    pub(crate) best_at_least: f64,
    /// The node that re-places its instances fails at most this many (the same iteration's
    /// largest residual): the floor's own gap.
    pub(crate) repacked_at_most: f64,
    /// Count vectors of live instances that fit the node.
    pub(crate) states: usize,
    pub(crate) iterations: usize,
}

/// Bits per profile count in a packed state (a node of at most 255 instances per profile).
const BITS: u32 = 8;

/// The node that re-places its instances freely on `gpus` (identical MIG GPUs) under `mix`, for
/// at most `max_states` count vectors, iterating until the floor is within `tolerance`
/// (relative) of the same iteration's ceiling or for at most `max_iterations`. It may turn
/// away the requests of the mix with bit `r` set in `turn_away`: all of them for the floor; none
/// for a node without fragmentation that takes whatever fits (not a floor: what it takes blocks
/// later requests).
pub(crate) fn repacked_bound(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
    max_states: usize,
    (tolerance, max_iterations): (f64, usize),
    turn_away: u32,
) -> Result<Repacked, BoundError> {
    let (first, weights) = super::bound::checked(gpus, mix, mean_lifetime)?;
    let one = Gpus::solve(first, mix, mean_lifetime, max_states)
        .ok_or(BoundError::TooManyStates(max_states))?;
    let kinds = Kinds::of(&one)?;
    let node = Counts::new(&one, &kinds, gpus.len(), max_states)?;
    Ok(node.solve(
        &kinds.takes,
        &weights,
        1.0 / mean_lifetime,
        tolerance,
        max_iterations,
        turn_away,
    ))
}

/// The kinds of instance one GPU holds (a profile, or a whole GPU), and which kinds each request
/// of the mix can take.
struct Kinds {
    ids: Vec<u32>,
    takes: Vec<Vec<usize>>,
}

impl Kinds {
    fn of(one: &Gpus) -> Result<Self, BoundError> {
        let mut ids: Vec<u32> = one.states.sets.iter().flatten().map(|h| h.0).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() * BITS as usize > 64 {
            return Err(BoundError::TooManyRequests(ids.len()));
        }
        let mut kinds = Self {
            ids,
            takes: Vec::new(),
        };
        // What each request becomes on an empty GPU.
        kinds.takes = one
            .choices
            .first()
            .map(|per_request| {
                per_request
                    .iter()
                    .map(|next| {
                        let mut ks: Vec<usize> = next
                            .iter()
                            .flat_map(|s| one.states.sets[*s].iter().map(|h| kinds.of_held(h)))
                            .collect();
                        ks.sort_unstable();
                        ks.dedup();
                        ks
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(kinds)
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    fn of_held(&self, held: &Held) -> usize {
        self.ids.iter().position(|k| *k == held.0).unwrap_or(0)
    }

    /// One GPU's distinct count vectors, packed (`BITS` per kind).
    fn per_gpu(&self, one: &Gpus) -> Vec<u64> {
        one.states
            .sets
            .iter()
            .map(|set| self.packed(set))
            .collect::<HashSet<u64>>()
            .into_iter()
            .collect()
    }

    /// One GPU's layout as its packed count vector.
    fn packed(&self, set: &[Held]) -> u64 {
        set.iter()
            .map(|held| 1u64 << (BITS * self.of_held(held) as u32))
            .sum()
    }

    /// A packed count vector's count of kind `k`.
    fn count(packed: u64, k: usize) -> u32 {
        ((packed >> (BITS * k as u32)) & ((1u64 << BITS) - 1)) as u32
    }
}

/// The node's states: count vectors (packed, `BITS` per kind) and their neighbours.
struct Counts {
    kinds: usize,
    /// Per state and kind: live instances.
    counts: Vec<u32>,
    /// Per state and kind: the state with one more (`u32::MAX` when it does not fit) and one
    /// fewer (`u32::MAX` when none is live).
    more: Vec<u32>,
    fewer: Vec<u32>,
}

impl Counts {
    fn new(one: &Gpus, kinds: &Kinds, gpus: usize, max_states: usize) -> Result<Self, BoundError> {
        // One GPU's count vectors, then the node's: sums of one per GPU.
        let per_gpu = kinds.per_gpu(one);
        let most_on_one = one.states.sets.iter().map(Vec::len).max().unwrap_or(0);
        if most_on_one * gpus >= 1 << BITS {
            return Err(BoundError::TooManyInstances(gpus));
        }
        let mut node: HashSet<u64> = HashSet::from([0]);
        for _ in 0..gpus {
            // Packed sums add per kind without carries: a kind's count stays below 2^BITS.
            let mut next = HashSet::with_capacity(node.len() * 2);
            for a in &node {
                for b in &per_gpu {
                    next.insert(a + b);
                }
            }
            if next.len() > max_states {
                return Err(BoundError::TooManyStates(max_states));
            }
            node = next;
        }
        let mut packed: Vec<u64> = node.into_iter().collect();
        packed.sort_unstable();
        let index: HashMap<u64, u32> = packed
            .iter()
            .enumerate()
            .map(|(i, p)| (*p, i as u32))
            .collect();
        let kinds = kinds.len();
        let counts: Vec<u32> = packed
            .iter()
            .flat_map(|p| (0..kinds).map(move |k| Kinds::count(*p, k)))
            .collect();
        let mut more = vec![u32::MAX; packed.len() * kinds];
        let mut fewer = vec![u32::MAX; packed.len() * kinds];
        for (i, p) in packed.iter().enumerate() {
            for k in 0..kinds {
                let unit = 1u64 << (BITS * k as u32);
                if let Some(j) = index.get(&(p + unit)) {
                    more[i * kinds + k] = *j;
                }
                if counts[i * kinds + k] > 0 {
                    fewer[i * kinds + k] = index.get(&(p - unit)).copied().unwrap_or(u32::MAX);
                }
            }
        }
        Ok(Self {
            kinds,
            counts,
            more,
            fewer,
        })
    }

    /// Relative value iteration, uniformized: `h ← h + B h / Λ`, where `B h(c)` is the cheapest
    /// rate of failures plus the drift of `h` at `c`. For any `h` the least `B h` over the states
    /// is at most the optimum (averaged over the optimal run's states it is at most its rate),
    /// and the largest at least.
    fn solve(
        &self,
        takes: &[Vec<usize>],
        weights: &[f64],
        leave_rate: f64,
        tolerance: f64,
        max_iterations: usize,
        turn_away: u32,
    ) -> Repacked {
        let n = self.counts.len() / self.kinds.max(1);
        let most_live = self
            .counts
            .chunks(self.kinds.max(1))
            .map(|c| c.iter().sum::<u32>())
            .max()
            .unwrap_or(0);
        // Above the largest total rate, so that every state keeps some of itself (aperiodic).
        let uniform = 1.0 + f64::from(most_live) * leave_rate + 0.1;
        let limits = (tolerance, max_iterations);
        let (floor, ceiling, iterations) =
            relative_value_iteration(n, uniform, limits, |h, drift| {
                for (i, slot) in drift.iter_mut().enumerate() {
                    let here = h[i];
                    let mut rate = 0.0;
                    for (r, w) in weights.iter().enumerate() {
                        let mut cheapest = if turn_away & (1 << r) != 0 {
                            1.0
                        } else {
                            f64::INFINITY
                        };
                        for k in &takes[r] {
                            let j = self.more[i * self.kinds + k];
                            if j != u32::MAX {
                                cheapest = f64::min(cheapest, h[j as usize] - here);
                            }
                        }
                        if cheapest == f64::INFINITY {
                            cheapest = 1.0;
                        }
                        rate += w * cheapest;
                    }
                    for k in 0..self.kinds {
                        let live = self.counts[i * self.kinds + k];
                        if live > 0 {
                            let j = self.fewer[i * self.kinds + k] as usize;
                            rate += f64::from(live) * leave_rate * (h[j] - here);
                        }
                    }
                    *slot = rate;
                }
            });
        Repacked {
            best_at_least: floor.max(0.0),
            repacked_at_most: ceiling,
            states: n,
            iterations,
        }
    }
}

/// Relative value iteration, uniformized at `uniform` (above every state's total rate, so that
/// each keeps some of itself): `drift_of(h, out)` writes `B h` per state, the cheapest rate of
/// failures plus the drift of `h`, and `h` moves by it, anchored at state 0 (the empty node) so
/// that the values stay bounded, until the least and largest `B h` are within `tolerance`
/// (relative) or for `max_iterations`. The least `B h` over the states is at most the optimum
/// whatever `h` is (averaged over the optimal run's states it is at most its rate), and the
/// largest at least. Returns both and the iterations.
fn relative_value_iteration(
    states: usize,
    uniform: f64,
    (tolerance, max_iterations): (f64, usize),
    mut drift_of: impl FnMut(&[f64], &mut [f64]),
) -> (f64, f64, usize) {
    let mut h = vec![0.0f64; states];
    let mut drift = vec![0.0f64; states];
    let (mut floor, mut ceiling, mut iterations) = (0.0, 1.0, 0);
    while iterations < max_iterations {
        iterations += 1;
        drift_of(&h, &mut drift);
        floor = drift.iter().copied().fold(f64::INFINITY, f64::min);
        ceiling = drift.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if ceiling - floor <= tolerance * ceiling.abs().max(1e-12) {
            break;
        }
        let anchor = drift.first().copied().unwrap_or(0.0);
        for (v, d) in h.iter_mut().zip(&drift) {
            *v += (d - anchor) / uniform;
        }
    }
    (floor, ceiling, iterations)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::test_inventory as node;

    /// The study's default mix, as `MIX` is written.
    #[cfg(feature = "experiments")]
    pub(in crate::online) const DEFAULT_MIX: &str =
        "1g.10gb=35,1g.20gb=10,2g.20gb=20,3g.40gb=20,4g.40gb=8,7g.80gb=7";

    /// The default mix less 1g.10gb, whose best order is solved exactly on 4×H100.
    #[cfg(feature = "experiments")]
    pub(in crate::online) const FOUR_H100_MIX: &str =
        "1g.20gb=45,2g.20gb=20,3g.40gb=20,4g.40gb=8,7g.80gb=7";

    /// The study's default mix, as H100 profiles.
    #[cfg(feature = "experiments")]
    pub(in crate::online) fn default_mix() -> Vec<(Wanted, f64)> {
        mix(&[
            ("1g.10gb", 35.0),
            ("1g.20gb", 10.0),
            ("2g.20gb", 20.0),
            ("3g.40gb", 20.0),
            ("4g.40gb", 8.0),
            ("7g.80gb", 7.0),
        ])
    }

    pub(super) fn mix(entries: &[(&str, f64)]) -> Vec<(Wanted, f64)> {
        entries
            .iter()
            .map(|(p, w)| (Wanted::Profile((*p).into()), *w))
            .collect()
    }

    #[test]
    fn whole_gpu_requests_are_bounded_as_erlang_says() {
        // One class of request: turning one away never pays, and re-placing changes nothing.
        let gpus = node("3xH100-SXM5-80GB").gpus;
        let floor = repacked_bound(
            &gpus,
            &mix(&[("7g.80gb", 1.0)]),
            2.5,
            1000,
            (1e-6, 100_000),
            u32::MAX,
        )
        .expect("floor");
        let want = super::super::many::tests::erlang_b(3, 2.5);
        assert!(
            (floor.best_at_least - want).abs() < 1e-6 * want,
            "{floor:?} want {want}"
        );
        assert_eq!(floor.states, 4);
    }

    #[test]
    fn the_states_are_the_count_vectors_of_every_node_state() {
        let gpus = node("3xA30-24GB").gpus;
        let mix = mix(&[("1g.6gb", 5.0), ("2g.12gb", 3.0), ("4g.24gb", 2.0)]);
        let one = Gpus::solve(&gpus[0], &mix, 3.0, 100_000).expect("one GPU");
        let kinds = Kinds::of(&one).expect("kinds");
        let kind_of = |held: &Held| kinds.of_held(held);
        let counts = Counts::new(&one, &kinds, 3, 100_000).expect("counts");
        let mut want: HashSet<Vec<u32>> = HashSet::new();
        let n = one.states.sets.len();
        for a in 0..n {
            for b in a..n {
                for c in b..n {
                    let mut v = vec![0u32; kinds.len()];
                    for held in [a, b, c].iter().flat_map(|s| &one.states.sets[*s]) {
                        v[kind_of(held)] += 1;
                    }
                    want.insert(v);
                }
            }
        }
        let got: HashSet<Vec<u32>> = counts
            .counts
            .chunks(kinds.len())
            .map(<[u32]>::to_vec)
            .collect();
        assert_eq!(got, want);
        // Each state's neighbours are its count vector plus or minus one of a kind.
        for (i, c) in counts.counts.chunks(kinds.len()).enumerate() {
            for k in 0..kinds.len() {
                let more = counts.more[i * kinds.len() + k];
                let mut plus = c.to_vec();
                plus[k] += 1;
                assert_eq!(more != u32::MAX, want.contains(&plus), "{c:?} + {k}");
            }
        }
    }

    #[test]
    fn on_three_gpus_the_floor_is_below_the_best_order_and_above_the_other() {
        let gpus = node("3xA30-24GB").gpus;
        let mix = mix(&[("1g.6gb", 5.0), ("2g.12gb", 3.0), ("4g.24gb", 2.0)]);
        let exact = super::super::many::rates(&gpus, &mix, 3.0, 100_000).expect("exact");
        let floor =
            repacked_bound(&gpus, &mix, 3.0, 100_000, (1e-6, 100_000), u32::MAX).expect("floor");
        assert!(
            floor.best_at_least <= exact.best + 1e-9,
            "{floor:?} vs {exact:?}"
        );
        assert!(floor.repacked_at_most >= floor.best_at_least, "{floor:?}");
        // The additive values prove 0.0593 of the best order's 0.0709 here.
        assert!(floor.best_at_least > 0.0593, "{floor:?} vs {exact:?}");
    }

    #[test]
    fn nodes_of_too_many_instances_are_refused() {
        let gpus = node("37xA100-SXM4-40GB").gpus;
        assert_eq!(
            repacked_bound(
                &gpus,
                &mix(&[("1g.5gb", 1.0)]),
                2.0,
                100_000,
                (1e-4, 10),
                u32::MAX
            ),
            Err(BoundError::TooManyInstances(37))
        );
    }

    /// Checks that a floor lies between the plain floor and the best order's failure rate on
    /// 3×A30, where the best order is solved exactly.
    #[cfg(feature = "experiments")]
    pub(super) fn between_the_best_order_and_the_plain_floor(
        floor: impl Fn(&[Gpu], &[(Wanted, f64)], f64) -> f64,
    ) {
        let gpus = node("3xA30-24GB").gpus;
        let mix = mix(&[("1g.6gb", 5.0), ("2g.12gb", 3.0), ("4g.24gb", 2.0)]);
        for lifetime in [1.5, 3.0, 6.0] {
            let exact = super::super::many::rates(&gpus, &mix, lifetime, 100_000).expect("exact");
            let plain = repacked_bound(&gpus, &mix, lifetime, 100_000, (1e-7, 100_000), u32::MAX)
                .expect("plain");
            let got = floor(&gpus, &mix, lifetime);
            eprintln!(
                "lifetime {lifetime}: best {:.5}, plain {:.5}, this floor {got:.5}",
                exact.best, plain.best_at_least
            );
            assert!(got <= exact.best + 1e-9);
            assert!(got >= plain.best_at_least - 1e-6);
        }
    }

    /// The GPUs of the node in `SPEC` and the mix in `MIX`, or the defaults.
    #[cfg(feature = "experiments")]
    pub(in crate::online) fn env_node(spec: &str, mix: &str) -> (Vec<Gpu>, Vec<(Wanted, f64)>) {
        let spec = std::env::var("SPEC").unwrap_or_else(|_| spec.into());
        (node(&spec).gpus, env_mix(mix))
    }

    /// The comma-separated values in the environment variable `name`, or `default`.
    #[cfg(feature = "experiments")]
    pub(in crate::online) fn env_list<T: std::str::FromStr>(name: &str, default: &str) -> Vec<T> {
        std::env::var(name)
            .unwrap_or_else(|_| default.into())
            .split(',')
            .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: {v:?}")))
            .collect()
    }

    /// The mix in `MIX` (`profile=weight,...`, `gpu` for a whole GPU), or `default`.
    #[cfg(feature = "experiments")]
    pub(in crate::online) fn env_mix(default: &str) -> Vec<(Wanted, f64)> {
        std::env::var("MIX")
            .unwrap_or_else(|_| default.into())
            .split(',')
            .map(|e| {
                let (p, w) = e.split_once('=').expect("NAME=WEIGHT");
                let wanted = if p == "gpu" {
                    Wanted::WholeGpu
                } else {
                    Wanted::Profile(p.into())
                };
                (wanted, w.parse().expect("weight"))
            })
            .collect()
    }

    /// The floor on 8×H100 (`SPEC`, `MIX`, `LIFETIMES`), beside the node that re-places freely
    /// but turns away only the requests of each `TURN_AWAY` bit mask (`0`: none).
    #[cfg(feature = "experiments")]
    #[test]
    #[ignore = "an experiment"]
    fn repacked_on_eight() {
        let (gpus, mix) = env_node("8xH100-SXM5-80GB", DEFAULT_MIX);
        for lifetime in env_list::<f64>("LIFETIMES", "15,20,25,30") {
            let started = std::time::Instant::now();
            let r = repacked_bound(&gpus, &mix, lifetime, 10_000_000, (1e-4, 100_000), u32::MAX);
            eprintln!("lifetime {lifetime}: {r:?}");
            for mask in env_list::<u32>("TURN_AWAY", "0") {
                let some = repacked_bound(&gpus, &mix, lifetime, 10_000_000, (1e-4, 100_000), mask);
                eprintln!("  turning away requests {mask:#b} only: {some:?}");
            }
            eprintln!(
                "lifetime {lifetime}: {r:?} in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
}

/// A tighter relaxation, tried: the same node, knowing also how many GPUs are empty. An order
/// must place a request when a GPU is empty (every request fits an empty GPU), so this node may
/// turn a request away only when none is; a 7g request or a whole GPU takes an empty GPU, and
/// its leaving empties one. Which other departures empty a GPU is up to the node (its best
/// choice among those the counts allow): an order's run is still one of its runs, so its optimum
/// is still a floor.
#[cfg(all(test, feature = "experiments"))]
mod empty_tracked {
    use super::*;
    use crate::test_inventory as node;

    const NONE: u32 = u32::MAX;

    /// The floor, its ceiling, the states and the iterations.
    pub(super) fn floor(
        gpus: &[Gpu],
        mix: &[(Wanted, f64)],
        mean_lifetime: f64,
        tolerance: f64,
    ) -> (f64, f64, usize, usize) {
        let (first, weights) = super::super::bound::checked(gpus, mix, mean_lifetime).expect("mix");
        let one = Gpus::solve(first, mix, mean_lifetime, 100_000).expect("one GPU");
        let kinds = Kinds::of(&one).expect("kinds");
        let n_kinds = kinds.len();
        // Kinds that never share a GPU.
        let alone: Vec<bool> = (0..n_kinds)
            .map(|k| {
                !one.states
                    .sets
                    .iter()
                    .any(|set| set.len() > 1 && set.iter().any(|h| kinds.of_held(h) == k))
            })
            .collect();
        let takes = &kinds.takes;
        let per_gpu = kinds.per_gpu(&one);
        // Count vectors that fit on n GPUs, n = 0..=G.
        let count = gpus.len();
        let mut levels: Vec<HashSet<u64>> = vec![HashSet::from([0])];
        for n in 0..count {
            let mut next = HashSet::new();
            for a in &levels[n] {
                for b in &per_gpu {
                    next.insert(a + b);
                }
            }
            levels.push(next);
        }
        let total = |p: u64| -> u32 { (0..n_kinds).map(|k| Kinds::count(p, k)).sum() };
        // States (count vector, empty GPUs): the counts fit exactly on the other GPUs, one at
        // least on each. The empty node first (the anchor).
        let mut states: Vec<(u64, usize)> = vec![(0, count)];
        for empty in 0..count {
            let busy = count - empty;
            let mut here: Vec<u64> = levels[busy]
                .iter()
                .copied()
                .filter(|p| total(*p) as usize >= busy)
                .collect();
            here.sort_unstable();
            states.extend(here.into_iter().map(|p| (p, empty)));
        }
        let index: HashMap<(u64, usize), u32> = states
            .iter()
            .enumerate()
            .map(|(i, s)| (*s, i as u32))
            .collect();
        let at = |p: u64, e: usize| index.get(&(p, e)).copied().unwrap_or(NONE);
        let n = states.len();
        // Per state and kind: placed on an empty GPU, placed beside others; leaving with its
        // GPU still busy, leaving it empty.
        let mut onto_empty = vec![NONE; n * n_kinds];
        let mut beside = vec![NONE; n * n_kinds];
        let mut leaves_busy = vec![NONE; n * n_kinds];
        let mut leaves_empty = vec![NONE; n * n_kinds];
        let mut counts = vec![0u32; n * n_kinds];
        for (i, (p, e)) in states.iter().enumerate() {
            for k in 0..n_kinds {
                let unit = 1u64 << (BITS * k as u32);
                let c = Kinds::count(*p, k);
                counts[i * n_kinds + k] = c;
                if *e > 0 {
                    onto_empty[i * n_kinds + k] = at(p + unit, e - 1);
                }
                if !alone[k] {
                    beside[i * n_kinds + k] = at(p + unit, *e);
                }
                if c > 0 {
                    if !alone[k] {
                        leaves_busy[i * n_kinds + k] = at(p - unit, *e);
                    }
                    leaves_empty[i * n_kinds + k] = at(p - unit, e + 1);
                }
            }
        }
        let leave_rate = 1.0 / mean_lifetime;
        let most_live = states.iter().map(|(p, _)| total(*p)).max().unwrap_or(0);
        let uniform = 1.0 + f64::from(most_live) * leave_rate + 0.1;
        let limits = (tolerance, 100_000);
        let (floor, ceiling, iterations) =
            relative_value_iteration(n, uniform, limits, |h, drift| {
                for (i, slot) in drift.iter_mut().enumerate() {
                    let here = h[i];
                    let empty = states[i].1;
                    let value = |j: u32| {
                        if j == NONE {
                            f64::INFINITY
                        } else {
                            h[j as usize] - here
                        }
                    };
                    let mut rate = 0.0;
                    for (r, w) in weights.iter().enumerate() {
                        // With an empty GPU every request is placed; without, it may be turned away.
                        let mut cheapest = if empty > 0 { f64::INFINITY } else { 1.0 };
                        for k in &takes[r] {
                            cheapest = cheapest
                                .min(value(onto_empty[i * n_kinds + k]))
                                .min(value(beside[i * n_kinds + k]));
                        }
                        if cheapest == f64::INFINITY {
                            cheapest = 1.0;
                        }
                        rate += w * cheapest;
                    }
                    for k in 0..n_kinds {
                        let live = counts[i * n_kinds + k];
                        if live > 0 {
                            let next = value(leaves_busy[i * n_kinds + k])
                                .min(value(leaves_empty[i * n_kinds + k]));
                            assert!(
                                next.is_finite(),
                                "state {:?} kind {k}: nowhere to go",
                                states[i]
                            );
                            rate += f64::from(live) * leave_rate * next;
                        }
                    }
                    *slot = rate;
                }
            });
        (floor.max(0.0), ceiling, n, iterations)
    }

    #[test]
    fn below_the_best_order_and_above_the_plain_floor() {
        tests::between_the_best_order_and_the_plain_floor(|gpus, mix, lifetime| {
            floor(gpus, mix, lifetime, 1e-7).0
        });
        let whole = tests::mix(&[("7g.80gb", 1.0)]);
        let (tracked, _, _, _) = floor(&node("3xH100-SXM5-80GB").gpus, &whole, 2.5, 1e-8);
        let want = super::super::many::tests::erlang_b(3, 2.5);
        assert!((tracked - want).abs() < 1e-6, "{tracked} vs {want}");
    }

    #[test]
    #[ignore = "an experiment"]
    fn tracked_on_eight() {
        let gpus = node("8xH100-SXM5-80GB").gpus;
        let mix = tests::default_mix();
        for lifetime in [15.0, 20.0, 25.0, 30.0] {
            let started = std::time::Instant::now();
            let got = floor(&gpus, &mix, lifetime, 1e-4);
            eprintln!(
                "lifetime {lifetime}: {got:?} in {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
}

/// A relaxation that sees which GPU holds what, tried: instances stay on their GPU but are
/// re-placed freely within it before every arrival, and requests may be turned away. Every
/// order's run is one of its runs, so its optimum is a floor; it cannot consolidate across GPUs
/// as the plain one does. Its state is the multiset of the GPUs' count vectors, so only small
/// nodes are solved.
#[cfg(all(test, feature = "experiments"))]
mod pinned {
    use super::*;

    const NONE: u32 = u32::MAX;

    /// The floor, the states and the iterations.
    fn floor(
        gpus: &[Gpu],
        mix: &[(Wanted, f64)],
        mean_lifetime: f64,
        tolerance: f64,
    ) -> (f64, usize, usize) {
        floor_forcing(gpus, mix, mean_lifetime, tolerance, false)
    }

    /// With `forcing`, a request is never turned away while some GPU has room for it however
    /// its instances lie (every order then has a device for it, so must place it).
    fn floor_forcing(
        gpus: &[Gpu],
        mix: &[(Wanted, f64)],
        mean_lifetime: f64,
        tolerance: f64,
        forcing: bool,
    ) -> (f64, usize, usize) {
        let (first, weights) = super::super::bound::checked(gpus, mix, mean_lifetime).expect("mix");
        let one = Gpus::solve(first, mix, mean_lifetime, 100_000).expect("one GPU");
        let kinds = Kinds::of(&one).expect("kinds");
        let n_kinds = kinds.len();
        let mut per = kinds.per_gpu(&one);
        per.sort_unstable();
        eprintln!("  {} count vectors on one GPU", per.len());
        let at: HashMap<u64, u32> = per
            .iter()
            .enumerate()
            .map(|(i, p)| (*p, i as u32))
            .collect();
        let n_requests = weights.len();
        // must[c * R + r]: request r fits every layout of count vector c.
        let mut must = vec![forcing; per.len() * n_requests];
        for (s, set) in one.states.sets.iter().enumerate() {
            let c = at[&kinds.packed(set)] as usize;
            for r in 0..n_requests {
                if one.choices[s][r].is_empty() {
                    must[c * n_requests + r] = false;
                }
            }
        }
        let unit = |k: usize| 1u64 << (BITS * k as u32);
        let plus: Vec<u32> = per
            .iter()
            .flat_map(|p| (0..n_kinds).map(move |k| (*p, k)))
            .map(|(p, k)| at.get(&(p + unit(k))).copied().unwrap_or(NONE))
            .collect();
        let minus: Vec<u32> = per
            .iter()
            .flat_map(|p| (0..n_kinds).map(move |k| (*p, k)))
            .map(|(p, k)| {
                if Kinds::count(p, k) > 0 {
                    at.get(&(p - unit(k))).copied().unwrap_or(NONE)
                } else {
                    NONE
                }
            })
            .collect();
        let empty = at[&0];
        // Every multiset of the GPUs' count vectors, by search from the empty node.
        let start: Vec<u32> = vec![empty; gpus.len()];
        let mut states: Vec<Vec<u32>> = vec![start.clone()];
        let mut index: HashMap<Vec<u32>, u32> = HashMap::from([(start, 0)]);
        let mut arrivals: Vec<Vec<Vec<u32>>> = Vec::new();
        let mut departures: Vec<Vec<(u32, u32)>> = Vec::new();
        let mut forced: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < states.len() {
            let state = states[i].clone();
            let mut visit = |g: usize, to: u32| -> u32 {
                let mut next = state.clone();
                next[g] = to;
                next.sort_unstable();
                if let Some(j) = index.get(&next) {
                    return *j;
                }
                let j = states.len() as u32;
                index.insert(next.clone(), j);
                states.push(next);
                j
            };
            let mut per_request = Vec::with_capacity(weights.len());
            let mut forced_here = 0u32;
            for r in 0..weights.len() {
                if state.iter().any(|c| must[*c as usize * n_requests + r]) {
                    forced_here |= 1 << r;
                }
                let mut next = Vec::new();
                for g in 0..gpus.len() {
                    if g > 0 && state[g] == state[g - 1] {
                        continue;
                    }
                    for k in &kinds.takes[r] {
                        let to = plus[state[g] as usize * n_kinds + k];
                        if to != NONE {
                            next.push(visit(g, to));
                        }
                    }
                }
                per_request.push(next);
            }
            let mut leaving = Vec::new();
            for g in 0..gpus.len() {
                for k in 0..n_kinds {
                    let live = Kinds::count(per[state[g] as usize], k);
                    if live > 0 {
                        let to = minus[state[g] as usize * n_kinds + k];
                        assert_ne!(to, NONE, "a count vector less one is a count vector");
                        leaving.push((visit(g, to), live));
                    }
                }
            }
            arrivals.push(per_request);
            departures.push(leaving);
            forced.push(forced_here);
            i += 1;
        }
        let n = states.len();
        let most_live = departures
            .iter()
            .map(|d| d.iter().map(|(_, l)| l).sum::<u32>())
            .max()
            .unwrap_or(0);
        let leave_rate = 1.0 / mean_lifetime;
        let uniform = 1.0 + f64::from(most_live) * leave_rate + 0.1;
        let limits = (tolerance, 100_000);
        let (floor, _, iterations) = relative_value_iteration(n, uniform, limits, |h, drift| {
            for (i, slot) in drift.iter_mut().enumerate() {
                let here = h[i];
                let mut rate = 0.0;
                for (r, w) in weights.iter().enumerate() {
                    let away = if forced[i] & (1 << r) != 0 {
                        f64::INFINITY
                    } else {
                        1.0
                    };
                    let cheapest = arrivals[i][r]
                        .iter()
                        .map(|j| h[*j as usize] - here)
                        .fold(away, f64::min);
                    rate += w * cheapest;
                }
                for (j, live) in &departures[i] {
                    rate += f64::from(*live) * leave_rate * (h[*j as usize] - here);
                }
                *slot = rate;
            }
        });
        (floor.max(0.0), n, iterations)
    }

    /// `SPEC`, `MIX`, `LIFETIMES`: the pinned floor beside the plain one (and the exact best
    /// order where `BEST` is set).
    #[test]
    #[ignore = "an experiment"]
    fn pinned_floor() {
        let (gpus, mix) = tests::env_node("4xH100-SXM5-80GB", tests::FOUR_H100_MIX);
        for lifetime in tests::env_list::<f64>("LIFETIMES", "3,4,6,8") {
            let started = std::time::Instant::now();
            let plain =
                repacked_bound(&gpus, &mix, lifetime, 10_000_000, (1e-6, 100_000), u32::MAX)
                    .expect("plain");
            let forcing = std::env::var("FORCING").is_ok();
            let (pinned, states, iterations) = floor_forcing(&gpus, &mix, lifetime, 1e-6, forcing);
            let mut line = format!(
                "lifetime {lifetime}: plain {:.4}%, pinned{} {:.4}% ({states} states, {iterations} iterations)",
                100.0 * plain.best_at_least,
                if forcing { " and forced" } else { "" },
                100.0 * pinned
            );
            if std::env::var("BEST").is_ok() {
                let (by_name, ours) =
                    super::super::many_simulated(&gpus, &mix, lifetime, 1_000_000);
                line += &format!(", name {:.4}%, ours {:.4}%", 100.0 * by_name, 100.0 * ours);
            }
            eprintln!("{line} in {:.0} s", started.elapsed().as_secs_f64());
        }
    }

    #[test]
    fn below_the_best_order_and_above_the_plain_floor() {
        tests::between_the_best_order_and_the_plain_floor(|gpus, mix, lifetime| {
            floor(gpus, mix, lifetime, 1e-7).0
        });
    }

    #[test]
    fn forced_below_the_best_order_and_above_the_pinned_floor() {
        tests::between_the_best_order_and_the_plain_floor(|gpus, mix, lifetime| {
            let forced = floor_forcing(gpus, mix, lifetime, 1e-7, true).0;
            let pinned = floor(gpus, mix, lifetime, 1e-7).0;
            eprintln!("  pinned {pinned:.5}, forced {forced:.5}");
            assert!(forced >= pinned - 1e-6);
            forced
        });
    }
}

/// Between the plain floor and the pinned one, tried: the GPUs in two groups, instances
/// re-placed freely within their group but never moved to the other. Every order's run is one of
/// its runs, so it is a floor; its state is one count vector per group.
#[cfg(all(test, feature = "experiments"))]
mod grouped {
    use super::*;

    /// The floor, the ceiling, the states and the iterations, with `split` GPUs in the first
    /// group and the rest in the second.
    fn floor(
        gpus: &[Gpu],
        mix: &[(Wanted, f64)],
        mean_lifetime: f64,
        split: usize,
        (tolerance, max_iterations): (f64, usize),
    ) -> (f64, f64, usize, usize) {
        let (first, weights) = super::super::bound::checked(gpus, mix, mean_lifetime).expect("mix");
        let one = Gpus::solve(first, mix, mean_lifetime, 100_000).expect("one GPU");
        let kinds = Kinds::of(&one).expect("kinds");
        let a = Counts::new(&one, &kinds, split, 10_000_000).expect("first group");
        let b = Counts::new(&one, &kinds, gpus.len() - split, 10_000_000).expect("second group");
        let nk = kinds.len();
        let (na, nb) = (a.counts.len() / nk, b.counts.len() / nk);
        let n = na * nb;
        let leave = 1.0 / mean_lifetime;
        let most = |c: &Counts| {
            c.counts
                .chunks(nk)
                .map(|v| v.iter().sum::<u32>())
                .max()
                .unwrap_or(0)
        };
        let uniform = 1.0 + f64::from(most(&a) + most(&b)) * leave + 0.1;
        let takes = &kinds.takes;
        let step = |s: usize, h: &[f64]| -> f64 {
            let (ia, ib) = (s / nb, s % nb);
            let here = h[s];
            let mut rate = 0.0;
            for (r, w) in weights.iter().enumerate() {
                let mut cheapest = 1.0f64;
                for k in &takes[r] {
                    let ja = a.more[ia * nk + k];
                    if ja != u32::MAX {
                        cheapest = cheapest.min(h[ja as usize * nb + ib] - here);
                    }
                    let jb = b.more[ib * nk + k];
                    if jb != u32::MAX {
                        cheapest = cheapest.min(h[ia * nb + jb as usize] - here);
                    }
                }
                rate += w * cheapest;
            }
            for k in 0..nk {
                let live = a.counts[ia * nk + k];
                if live > 0 {
                    let j = a.fewer[ia * nk + k] as usize * nb + ib;
                    rate += f64::from(live) * leave * (h[j] - here);
                }
                let live = b.counts[ib * nk + k];
                if live > 0 {
                    let j = ia * nb + b.fewer[ib * nk + k] as usize;
                    rate += f64::from(live) * leave * (h[j] - here);
                }
            }
            rate
        };
        let limits = (tolerance, max_iterations);
        let (low, high, iterations) = relative_value_iteration(n, uniform, limits, |h, drift| {
            let half = n.div_ceil(2);
            std::thread::scope(|scope| {
                let (left, right) = drift.split_at_mut(half);
                scope.spawn(move || {
                    for (i, slot) in left.iter_mut().enumerate() {
                        *slot = step(i, h);
                    }
                });
                for (i, slot) in right.iter_mut().enumerate() {
                    *slot = step(half + i, h);
                }
            });
        });
        (low.max(0.0), high, n, iterations)
    }

    #[test]
    fn below_the_best_order_and_above_the_plain_floor() {
        tests::between_the_best_order_and_the_plain_floor(|gpus, mix, lifetime| {
            floor(gpus, mix, lifetime, 1, (1e-7, 1_000_000)).0
        });
    }

    #[test]
    #[ignore = "an experiment"]
    fn grouped_floor() {
        let (gpus, mix) = tests::env_node("4xH100-SXM5-80GB", tests::FOUR_H100_MIX);
        let tolerance: f64 = tests::env_list("TOLERANCE", "1e-4")[0];
        let max_iterations: usize = tests::env_list("ITERATIONS", "100000")[0];
        for lifetime in tests::env_list::<f64>("LIFETIMES", "3,6,12") {
            for split in tests::env_list::<usize>("SPLITS", "1,2") {
                let started = std::time::Instant::now();
                let got = floor(&gpus, &mix, lifetime, split, (tolerance, max_iterations));
                eprintln!(
                    "lifetime {lifetime}, split {split}: floor {:.4}%, ceiling {:.4}% ({} states, {} iterations) in {:.0} s",
                    100.0 * got.0,
                    100.0 * got.1,
                    got.2,
                    got.3,
                    started.elapsed().as_secs_f64()
                );
            }
        }
    }
}
