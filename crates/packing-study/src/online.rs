//! The best any device order could do on a node of one GPU (or two, `pair`), exactly: a device
//! order cannot know when requests will leave, only what is placed now, so the best order is the
//! optimal policy of a Markov decision process over the node's states. The study's traces make that process exact:
//! one arrival per step drawn from the mix, and lifetimes `ceil(Exp(mean))`, which are
//! memoryless in steps (a live instance is still there at the next arrival with probability
//! `e^(-1/mean)`, whatever its age).
//!
//! Relative value iteration gives the long-run share of failed arrivals of the optimal policy,
//! and, with the decisions fixed, of name order and ours: exact rates without seed noise. The
//! gap between the optimum here and the hindsight optimum is what knowing lifetimes is worth.
use std::collections::{BTreeMap, HashMap};

use super::packing_study::Wanted;
use gpu_dra::gpu::mig::{gpu_device_name, mig_device_name, parse_mig_device_name};
use gpu_dra::gpu::{Gpu, NodeInventory};
use gpu_dra::slices::DeviceOrder;
use gpu_dra::slices::packing::{Usage, limits};
#[cfg(all(test, feature = "experiments"))]
mod experiment;

mod bound;
mod many;
mod pair;
mod repacked;

pub(super) use bound::BoundError;

/// What one live request holds: a profile id and placement start, or [`WHOLE`].
type Held = (u32, u32);

/// A whole GPU taken by a request.
const WHOLE: Held = (u32::MAX, 0);

/// Long-run share of failed arrivals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rates {
    pub(super) by_name: f64,
    pub(super) ours: f64,
    /// The optimal order's.
    pub(super) best: f64,
}

/// Which device a device order takes for a request beside the live devices (the study's fast
/// path, which the allocator checks).
pub(super) type FirstFit<'a> =
    dyn Fn(&BTreeMap<usize, String>, &Wanted, DeviceOrder) -> Option<String> + 'a;

/// The node's GPU states: every set of live requests that fits, closed under removal.
struct States {
    sets: Vec<Vec<Held>>,
    index: HashMap<Vec<Held>, usize>,
}

impl States {
    fn insert(&mut self, mut set: Vec<Held>) -> (usize, bool) {
        set.sort_unstable();
        if let Some(i) = self.index.get(&set) {
            return (*i, false);
        }
        self.sets.push(set.clone());
        self.index.insert(set, self.sets.len() - 1);
        (self.sets.len() - 1, true)
    }
}

fn usage_of(gpu: &Gpu, set: &[Held]) -> Usage {
    let mut usage = Usage::default();
    let Some(mig) = gpu.mig.as_ref() else {
        return usage;
    };
    for (id, start) in set {
        if let Some(profile) = mig.profile_by_id(*id)
            && let Some(placement) = profile.placements.iter().find(|p| p.start == *start)
        {
            usage.add(profile, *placement);
        }
    }
    usage
}

/// The live requests as the study's replay names them.
fn live_devices(gpu: &Gpu, set: &[Held]) -> BTreeMap<usize, String> {
    set.iter()
        .enumerate()
        .filter_map(|(i, held)| {
            if *held == WHOLE {
                return Some((i, gpu_device_name(gpu.minor)));
            }
            let profile = gpu.mig.as_ref()?.profile_by_id(held.0)?;
            Some((
                i,
                mig_device_name(gpu.minor, &profile.name, profile.id, held.1),
            ))
        })
        .collect()
}

/// Every placement of `wanted` that fits beside `set`, as the request it adds.
fn fitting(gpu: &Gpu, set: &[Held], wanted: &Wanted) -> Vec<Held> {
    if set.contains(&WHOLE) {
        return Vec::new();
    }
    match wanted {
        Wanted::WholeGpu => {
            if set.is_empty() {
                vec![WHOLE]
            } else {
                Vec::new()
            }
        }
        Wanted::Profile(name) => {
            let Some(profile) = gpu
                .mig
                .as_ref()
                .and_then(|m| m.profiles.iter().find(|p| &p.name == name))
            else {
                return Vec::new();
            };
            let usage = usage_of(gpu, set);
            let limits = limits(gpu);
            super::hindsight::fitting(&usage, &limits, profile)
                .map(|p| (profile.id, p.start))
                .collect()
        }
    }
}

/// One GPU's states, what each request can become in each, and where departures lead.
struct Gpus {
    states: States,
    /// Per state and request: the states a placement leads to.
    choices: Vec<Vec<Vec<usize>>>,
    /// Per state: the states departures leave, with their probabilities.
    departures: Vec<Vec<(usize, f64)>>,
}

impl Gpus {
    fn solve(
        gpu: &Gpu,
        mix: &[(Wanted, f64)],
        mean_lifetime: f64,
        max_states: usize,
    ) -> Option<Self> {
        let mut states = States {
            sets: Vec::new(),
            index: HashMap::new(),
        };
        states.insert(Vec::new());
        // Every state a sequence of placements reaches, with each state's choices per request.
        let mut choices: Vec<Vec<Vec<usize>>> = Vec::new();
        let mut at = 0;
        while at < states.sets.len() {
            let set = states.sets[at].clone();
            let mut per_request = Vec::with_capacity(mix.len());
            for (wanted, _) in mix {
                let mut next = Vec::new();
                for held in fitting(gpu, &set, wanted) {
                    let mut after = set.clone();
                    after.push(held);
                    let (i, _) = states.insert(after);
                    next.push(i);
                }
                per_request.push(next);
            }
            choices.push(per_request);
            if states.sets.len() > max_states {
                return None;
            }
            at += 1;
        }
        // Departures: each live request stays to the next arrival with probability `stay`.
        let stay = (-1.0 / mean_lifetime).exp();
        let departures: Vec<Vec<(usize, f64)>> = states
            .sets
            .iter()
            .map(|set| {
                (0u32..1 << set.len())
                    .filter_map(|mask| {
                        let mut kept: Vec<Held> = set
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| mask & (1 << i) != 0)
                            .map(|(_, h)| *h)
                            .collect();
                        let k = mask.count_ones() as i32;
                        let p = stay.powi(k) * (1.0 - stay).powi(set.len() as i32 - k);
                        kept.sort_unstable();
                        states.index.get(&kept).map(|i| (*i, p))
                    })
                    .collect()
            })
            .collect();
        Some(Self {
            states,
            choices,
            departures,
        })
    }
}

/// The exact long-run failure rates on a node with one MIG GPU, or two identical ones, or `None` for other nodes, or
/// when the GPU has more than `max_states` states (two GPUs: more than a million pairs). On two
/// GPUs the orders' decisions come from `packing::order` per pair of states; a sample of them is
/// checked against `first_fit`, and a disagreement gives `None`, as there is no exact answer.
pub(super) fn rates(
    base: &NodeInventory,
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
    max_states: usize,
    first_fit: &FirstFit<'_>,
) -> Option<Rates> {
    let total: f64 = mix.iter().map(|(_, w)| w).sum();
    if total <= 0.0 {
        return None;
    }
    let weights: Vec<f64> = mix.iter().map(|(_, w)| w / total).collect();
    let gpus: Vec<&Gpu> = base.gpus.iter().collect();
    let gpu = match gpus.as_slice() {
        [gpu] => *gpu,
        [a, b] if a.mig.is_some() && a.mig == b.mig => {
            return pair::rates(a, b, mix, &weights, mean_lifetime, first_fit);
        }
        _ => return None,
    };
    gpu.mig.as_ref()?;
    let Gpus {
        states,
        choices,
        departures,
    } = Gpus::solve(gpu, mix, mean_lifetime, max_states)?;
    // A fixed order's decision per state and request.
    let decided = |order: DeviceOrder| -> Option<Vec<Vec<Option<usize>>>> {
        states
            .sets
            .iter()
            .map(|set| {
                let live = live_devices(gpu, set);
                mix.iter()
                    .map(|(wanted, _)| {
                        let Some(device) = first_fit(&live, wanted, order) else {
                            return Some(None);
                        };
                        let held = if device == gpu_device_name(gpu.minor) {
                            WHOLE
                        } else {
                            let name = parse_mig_device_name(&device)?;
                            (name.profile_id, name.start)
                        };
                        let mut after = set.clone();
                        after.push(held);
                        after.sort_unstable();
                        states.index.get(&after).map(|i| Some(*i))
                    })
                    .collect()
            })
            .collect()
    };
    let by_name = decided(DeviceOrder::Name)?;
    let ours = decided(DeviceOrder::Packed)?;
    let solve = |policy: Option<&Vec<Vec<Option<usize>>>>| {
        average_cost(&choices, &departures, &weights, policy)
    };
    Some(Rates {
        by_name: solve(Some(&by_name)),
        ours: solve(Some(&ours)),
        best: solve(None),
    })
}

/// The exact long-run rates of ours and the best order on a node of identical GPUs with few
/// states each, in continuous time ([`many`]), or `None` past `max_states` node states.
pub(super) fn many_rates(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
    max_states: usize,
) -> Option<many::ManyRates> {
    many::rates(gpus, mix, mean_lifetime, max_states)
}

/// Most rounds of cutting planes for [`best_order_bound`] (8×H100 with the default mix: about
/// 30).
const BOUND_ROUNDS: usize = 500;

/// A lower bound on the best order's failures per arrival on a node of identical MIG GPUs of
/// any size, in continuous time, from values that add up over GPUs ([`bound`];
/// `--additive-bound`).
pub(super) fn best_order_bound(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
) -> Result<bound::Bound, bound::BoundError> {
    bound::best_order_bound(gpus, mix, mean_lifetime, 100_000, BOUND_ROUNDS, &mut |_| {})
}

/// Most count vectors of live instances [`repacked_bound`] solves (8×H100 with the default mix
/// and whole GPUs: 781,737).
const REPACKED_STATES: usize = 5_000_000;

/// The floor `--best-order-bound` reports: the node that re-places its instances freely and
/// may turn requests away, solved to within 0.01% ([`repacked`]).
pub(super) fn repacked_bound(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
) -> Result<repacked::Repacked, bound::BoundError> {
    repacked::repacked_bound(
        gpus,
        mix,
        mean_lifetime,
        REPACKED_STATES,
        (1e-4, 20_000),
        u32::MAX,
    )
}

/// Name order's and ours' (with the GPUs' real minors, where the exact solution lists GPUs by
/// state) failures per arrival in the same continuous-time model, simulated.
pub(super) fn many_simulated(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
    arrivals: usize,
) -> (f64, f64) {
    let simulate = |order| many::simulated(gpus, mix, mean_lifetime, arrivals, 1, order);
    (
        simulate(many::Simulated::ByName),
        simulate(many::Simulated::Ours),
    )
}

/// Long-run failures per arrival by relative value iteration over post-decision states: the
/// optimal policy's (`policy` `None`: the cheapest choice each time) or a fixed policy's.
fn average_cost(
    choices: &[Vec<Vec<usize>>],
    departures: &[Vec<(usize, f64)>],
    weights: &[f64],
    policy: Option<&Vec<Vec<Option<usize>>>>,
) -> f64 {
    relative_values(choices, departures, weights, policy).0
}

/// The gain and the relative values of the post-decision states (see [`average_cost`]).
fn relative_values(
    choices: &[Vec<Vec<usize>>],
    departures: &[Vec<(usize, f64)>],
    weights: &[f64],
    policy: Option<&Vec<Vec<Option<usize>>>>,
) -> (f64, Vec<f64>) {
    let n = choices.len();
    let mut h: Vec<f64> = vec![0.0; n];
    let mut after_arrival = vec![0.0; n];
    let mut gain = 0.0;
    for _ in 0..100_000 {
        // The expected cost-to-go once the arrival at a (pre-arrival) state is decided.
        for s in 0..n {
            after_arrival[s] = weights
                .iter()
                .enumerate()
                .map(|(r, w)| {
                    let next = match policy {
                        Some(p) => p[s][r],
                        None => choices[s][r]
                            .iter()
                            .copied()
                            .min_by(|a, b| h[*a].total_cmp(&h[*b])),
                    };
                    w * match next {
                        Some(next) => h[next],
                        None => 1.0 + h[s],
                    }
                })
                .sum();
        }
        let next: Vec<f64> = departures
            .iter()
            .map(|d| d.iter().map(|(s, p)| p * after_arrival[*s]).sum())
            .collect();
        let (estimate, span) = relative_update(&mut h, &next);
        gain = estimate;
        if span < 1e-12 {
            break;
        }
    }
    (gain, h)
}

/// One step of relative value iteration: `h` becomes `next` less its value at the first state.
/// Returns the gain's estimate (the middle of the per-state differences) and their span, which
/// bounds the estimate's error.
fn relative_update(h: &mut [f64], next: &[f64]) -> (f64, f64) {
    let (lo, hi) = next
        .iter()
        .zip(h.iter())
        .map(|(v, h)| v - h)
        .fold((f64::MAX, f64::MIN), |(lo, hi), d| (lo.min(d), hi.max(d)));
    let reference = next.first().copied().unwrap_or(0.0);
    for (h, v) in h.iter_mut().zip(next) {
        *h = v - reference;
    }
    ((lo + hi) / 2.0, hi - lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_dra::gpu::sim::SimNode;

    fn h100() -> NodeInventory {
        SimNode::new("1xH100-SXM5-80GB".parse().expect("spec"), "n", None)
            .inventory()
            .expect("inventory")
    }

    /// Lowest start first, whatever the order: a stand-in for the study's first fit.
    fn lowest(
        gpu: &Gpu,
    ) -> impl Fn(&BTreeMap<usize, String>, &Wanted, DeviceOrder) -> Option<String> {
        move |live, wanted, _| {
            let set: Vec<Held> = live
                .values()
                .filter_map(|d| parse_mig_device_name(d).map(|n| (n.profile_id, n.start)))
                .collect();
            let held = fitting(gpu, &set, wanted).into_iter().min_by_key(|h| h.1)?;
            let profile = gpu.mig.as_ref()?.profile_by_id(held.0)?;
            Some(mig_device_name(
                gpu.minor,
                &profile.name,
                profile.id,
                held.1,
            ))
        }
    }

    #[test]
    fn only_whole_gpu_profiles_have_no_choice() {
        // 7g requests: after every arrival the GPU holds one (placed, or the one that made the
        // arrival fail), so an arrival fails exactly when that one stayed.
        let base = h100();
        let gpu = &base.gpus[0];
        let mix = vec![(Wanted::Profile("7g.80gb".into()), 1.0)];
        let rates = rates(&base, &mix, 2.0, 10_000, &lowest(gpu)).expect("rates");
        let stay = (-0.5f64).exp();
        let want = stay;
        assert!((rates.best - want).abs() < 1e-9, "{rates:?} want {want}");
        assert!((rates.ours - want).abs() < 1e-9);
    }

    #[test]
    fn the_optimum_is_never_worse_than_a_fixed_order() {
        let base = h100();
        let gpu = &base.gpus[0];
        let mix = vec![
            (Wanted::Profile("1g.10gb".into()), 3.0),
            (Wanted::Profile("3g.40gb".into()), 1.0),
            (Wanted::Profile("4g.40gb".into()), 1.0),
        ];
        let rates = rates(&base, &mix, 3.0, 10_000, &lowest(gpu)).expect("rates");
        assert!(rates.best <= rates.ours + 1e-12, "{rates:?}");
        // 1g at the lowest start splits the 4g's block: the optimum does better.
        assert!(rates.best < rates.ours - 1e-3, "{rates:?}");
    }

    #[test]
    fn two_gpus_of_whole_gpu_profiles() {
        // 7g requests on two GPUs: after an arrival k ∈ {1, 2} GPUs are busy. From k = 2 the
        // next arrival fails when both stayed (s²); the chain on k has π(2) = s / (s + (1 − s)²),
        // so the rate is s³ / (s + (1 − s)²), whichever order.
        let base = SimNode::new("2xH100-SXM5-80GB".parse().expect("spec"), "n", None)
            .inventory()
            .expect("inventory");
        let mix = vec![(Wanted::Profile("7g.80gb".into()), 1.0)];
        let seven_g = base.gpus[0]
            .mig
            .as_ref()
            .and_then(|m| m.profiles.iter().find(|p| p.name == "7g.80gb"))
            .expect("7g")
            .id;
        // Both orders take the first GPU without a 7g.
        let first_free = |live: &BTreeMap<usize, String>, _: &Wanted, _: DeviceOrder| {
            (0..2)
                .find(|minor| {
                    !live
                        .values()
                        .any(|d| parse_mig_device_name(d).is_some_and(|n| n.parent_minor == *minor))
                })
                .map(|minor| mig_device_name(minor, "7g.80gb", seven_g, 0))
        };
        let rates = rates(&base, &mix, 3.0, 10_000, &first_free).expect("rates");
        let s = (-1.0f64 / 3.0).exp();
        let want = s.powi(3) / (s + (1.0 - s).powi(2));
        for got in [rates.best, rates.ours, rates.by_name] {
            assert!((got - want).abs() < 1e-8, "{rates:?} want {want}");
        }
    }

    #[test]
    fn nodes_of_three_gpus_are_not_solved() {
        let base = SimNode::new("3xH100-SXM5-80GB".parse().expect("spec"), "n", None)
            .inventory()
            .expect("inventory");
        let gpu = base.gpus[0].clone();
        let mix = vec![(Wanted::Profile("1g.10gb".into()), 1.0)];
        assert_eq!(rates(&base, &mix, 2.0, 10_000, &lowest(&gpu)), None);
    }
}
