//! The best order on a node of N identical GPUs, exactly, where one GPU has few states (an A30,
//! or an H100 with a mix of big slices): how far ours is from the limit when the choice of GPU
//! among many is part of every decision, which the one- and two-GPU solvers cannot say.
//!
//! The GPUs are interchangeable, so a node state is a multiset of one GPU's states (ranked in
//! the combinatorial number system). Tracking which of N GPUs holds what per step (as the
//! study's discrete traces would need, departures of any subset at once) is out of reach for a
//! multiset, so this model is the study's in continuous time: arrivals at rate 1, each live
//! request leaves at rate `1 / mean_lifetime`, uniformized into steps where at most one thing
//! happens. Its rates are close to, not the same as, the study's traces at the same lifetime;
//! ours and the best order are measured in the same model, which is what the comparison needs.
//!
//! Ours on a multiset lists the GPUs by state (the state with the lowest index first) where the
//! node lists them by minor: where `packing::order` ties GPUs of different states it may pick
//! another one than on the node. [`simulated`] replays ours with real minors (and name order,
//! which depends on which GPU is which and has no multiset form) to measure that.
use super::super::packing_study::{Rng, Wanted, draw};
use super::{Gpus, Held, WHOLE, relative_update};
use gpu_dra::gpu::Gpu;
use gpu_dra::gpu::mig::mig_device_name;

/// No decision: the request fails.
const NONE: u32 = u32::MAX;

/// Long-run failures per arrival on a node of identical GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ManyRates {
    pub(crate) ours: f64,
    pub(crate) best: f64,
    /// The node's states (multisets of one GPU's states).
    pub(crate) states: usize,
}

/// Multisets of `k` values below `n`, ranked: `rank` of the sorted values is
/// `Σ C(v_i + i, i + 1)`.
struct Multisets {
    n: usize,
    k: usize,
    /// `binomial[x][j]` = C(x, j).
    binomial: Vec<Vec<u64>>,
}

impl Multisets {
    fn new(n: usize, k: usize) -> Self {
        let rows = n + k + 1;
        let mut binomial = vec![vec![0u64; k + 2]; rows];
        for x in 0..rows {
            binomial[x][0] = 1;
            for j in 1..=(k + 1).min(x) {
                binomial[x][j] = binomial[x - 1][j - 1].saturating_add(binomial[x - 1][j]);
            }
        }
        Self { n, k, binomial }
    }

    fn count(&self) -> u64 {
        self.binomial[self.n + self.k - 1][self.k]
    }

    /// The rank of `values` (sorted ascending).
    fn rank(&self, values: &[usize]) -> usize {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| self.binomial[v + i][i + 1] as usize)
            .sum()
    }

    /// The sorted values of `rank`.
    fn unrank(&self, mut rank: usize, out: &mut [usize]) {
        for i in (0..self.k).rev() {
            // The largest c with C(c, i + 1) <= rank; c = v + i.
            let mut c = i;
            while c + 1 < self.binomial.len() && self.binomial[c + 1][i + 1] as usize <= rank {
                c += 1;
            }
            rank -= self.binomial[c][i + 1] as usize;
            out[i] = c - i;
        }
    }
}

/// The node process: per state, where each request can go (the best order's choices), where
/// ours puts it, and where departures lead.
struct Node {
    requests: usize,
    /// Per state and request, offsets into `choices`.
    choice_at: Vec<u32>,
    choices: Vec<u32>,
    /// Per state and request: ours' next state, or [`NONE`].
    ours: Vec<u32>,
    /// Per state, offsets into `departures`: next state and how many live requests lead there.
    departure_at: Vec<u32>,
    departures: Vec<(u32, u32)>,
    /// Uniformization: total event rate per step, with requests leaving at `1 / mean_lifetime`.
    rate: f64,
    leave_rate: f64,
}

/// The rates on `gpus` (identical MIG GPUs) under `mix`, or `None` when the node has more than
/// `max_states` states or a GPU more than `max_states` (or the GPUs differ).
pub(super) fn rates(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
    max_states: usize,
) -> Option<ManyRates> {
    let first = gpus.first()?;
    if first.mig.is_none() || gpus.iter().any(|g| g.mig != first.mig) || mean_lifetime <= 0.0 {
        return None;
    }
    let total: f64 = mix.iter().map(|(_, w)| w).sum();
    if total <= 0.0 {
        return None;
    }
    let weights: Vec<f64> = mix.iter().map(|(_, w)| w / total).collect();
    let one = Gpus::solve(first, mix, mean_lifetime, max_states)?;
    let node = Node::build(gpus, &one, mix, mean_lifetime, max_states)?;
    let states = node.ours.len() / node.requests.max(1);
    Some(ManyRates {
        ours: node.failures_per_arrival(&weights, true),
        best: node.failures_per_arrival(&weights, false),
        states,
    })
}

/// Per GPU state: the states one departure leads to (one entry per live request).
pub(super) fn one_departure(one: &Gpus) -> Vec<Vec<usize>> {
    one.states
        .sets
        .iter()
        .map(|set| {
            (0..set.len())
                .filter_map(|i| {
                    let mut kept = set.clone();
                    kept.remove(i);
                    one.states.index.get(&kept).copied()
                })
                .collect()
        })
        .collect()
}

impl Node {
    fn build(
        gpus: &[Gpu],
        one: &Gpus,
        mix: &[(Wanted, f64)],
        mean_lifetime: f64,
        max_states: usize,
    ) -> Option<Self> {
        let n = one.states.sets.len();
        let k = gpus.len();
        let ranks = Multisets::new(n, k);
        let count = ranks.count();
        if count > max_states as u64 || count >= u64::from(NONE) {
            return None;
        }
        let count = count as usize;
        let leaving = one_departure(one);
        let most_live = one.states.sets.iter().map(Vec::len).max().unwrap_or(0) * k;
        let requests = mix.len();
        // Per chunk of states, built in parallel and joined in order.
        let workers = std::thread::available_parallelism().map_or(1, |w| w.get());
        let chunk = count.div_ceil(workers).max(1);
        let parts: Vec<Part> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    let (ranks, leaving) = (&ranks, &leaving);
                    scope.spawn(move || {
                        let range = (w * chunk).min(count)..((w + 1) * chunk).min(count);
                        Part::build(gpus, one, ranks, leaving, mix, range)
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        if parts.len() != workers {
            return None;
        }
        let mut node = Node {
            requests,
            choice_at: vec![0],
            choices: Vec::new(),
            ours: Vec::with_capacity(count * requests),
            departure_at: vec![0],
            departures: Vec::new(),
            // Strictly above the most that can happen, so every state keeps a self-loop.
            rate: 1.0 + (most_live as f64 + 1.0) / mean_lifetime,
            leave_rate: 1.0 / mean_lifetime,
        };
        for part in parts {
            let base = node.choices.len() as u32;
            node.choices.extend(&part.choices);
            node.choice_at
                .extend(part.choice_at.iter().skip(1).map(|o| o + base));
            let base = node.departures.len() as u32;
            node.departures.extend(&part.departures);
            node.departure_at
                .extend(part.departure_at.iter().skip(1).map(|o| o + base));
            node.ours.extend(&part.ours);
        }
        Some(node)
    }

    /// Long-run failures per arrival by relative value iteration on the uniformized process:
    /// ours' (`ours`) or the best order's (the cheapest choice each time).
    fn failures_per_arrival(&self, weights: &[f64], ours: bool) -> f64 {
        self.relative_values(weights, ours).0
    }

    /// Failures per arrival and the relative values (per state) they were solved with.
    fn relative_values(&self, weights: &[f64], ours: bool) -> (f64, Vec<f64>) {
        let count = self.ours.len() / self.requests.max(1);
        let mut h = vec![0.0f64; count];
        let mut next = vec![0.0f64; count];
        let arrive = 1.0 / self.rate;
        let leave = self.leave_rate / self.rate;
        let workers = std::thread::available_parallelism().map_or(1, |w| w.get());
        let chunk = count.div_ceil(workers).max(1);
        let mut gain = 0.0;
        for _ in 0..1_000_000 {
            std::thread::scope(|scope| {
                for (c, out) in next.chunks_mut(chunk).enumerate() {
                    let h = &h;
                    scope.spawn(move || {
                        for (i, slot) in out.iter_mut().enumerate() {
                            *slot = self.step(h, c * chunk + i, weights, ours, arrive, leave);
                        }
                    });
                }
            });
            let (estimate, span) = relative_update(&mut h, &next);
            gain = estimate;
            if span < 1e-11 {
                break;
            }
        }
        (gain / arrive, h)
    }

    /// One uniformized step's expected cost-to-go from state `s`.
    fn step(
        &self,
        h: &[f64],
        s: usize,
        weights: &[f64],
        ours: bool,
        arrive: f64,
        leave: f64,
    ) -> f64 {
        let stay_here = h[s];
        let mut arrival = 0.0;
        for (r, w) in weights.iter().enumerate() {
            let at = s * self.requests + r;
            let to = if ours {
                let d = self.ours[at];
                (d != NONE).then(|| h[d as usize])
            } else {
                let (from, to) = (self.choice_at[at] as usize, self.choice_at[at + 1] as usize);
                self.choices[from..to]
                    .iter()
                    .map(|d| h[*d as usize])
                    .min_by(f64::total_cmp)
            };
            arrival += w * to.unwrap_or(1.0 + stay_here);
        }
        let (from, to) = (
            self.departure_at[s] as usize,
            self.departure_at[s + 1] as usize,
        );
        let mut leaving = 0.0;
        let mut moved = 0.0;
        for (d, many) in &self.departures[from..to] {
            let p = leave * f64::from(*many);
            leaving += p * h[*d as usize];
            moved += p;
        }
        arrive * arrival + leaving + (1.0 - arrive - moved) * stay_here
    }
}

/// A chunk of the node's states, built on one thread.
struct Part {
    choice_at: Vec<u32>,
    choices: Vec<u32>,
    ours: Vec<u32>,
    departure_at: Vec<u32>,
    departures: Vec<(u32, u32)>,
}

impl Part {
    fn build(
        gpus: &[Gpu],
        one: &Gpus,
        ranks: &Multisets,
        leaving: &[Vec<usize>],
        mix: &[(Wanted, f64)],
        range: std::ops::Range<usize>,
    ) -> Self {
        let k = ranks.k;
        let mut part = Part {
            choice_at: vec![0],
            choices: Vec::new(),
            ours: Vec::new(),
            departure_at: vec![0],
            departures: Vec::new(),
        };
        let mut values = vec![0usize; k];
        let mut moved = vec![0usize; k];
        // The state with GPU `g`'s state replaced by `to`, ranked.
        let mut replaced = |values: &[usize], g: usize, to: usize| -> u32 {
            moved.copy_from_slice(values);
            moved[g] = to;
            moved.sort_unstable();
            ranks.rank(&moved) as u32
        };
        for s in range {
            ranks.unrank(s, &mut values);
            let sets: Vec<Vec<Held>> = values.iter().map(|v| one.states.sets[*v].clone()).collect();
            for (r, (wanted, _)) in mix.iter().enumerate() {
                let mut next: Vec<u32> = Vec::new();
                for g in 0..k {
                    // GPUs in the same state are interchangeable: the first of them stands for all.
                    if g > 0 && values[g] == values[g - 1] {
                        continue;
                    }
                    for to in &one.choices[values[g]][r] {
                        next.push(replaced(&values, g, *to));
                    }
                }
                next.sort_unstable();
                next.dedup();
                part.choices.extend(&next);
                part.choice_at.push(part.choices.len() as u32);
                let decided = ours(gpus, &sets, wanted).and_then(|(g, held)| {
                    let mut after = sets[g].clone();
                    after.push(held);
                    after.sort_unstable();
                    let to = *one.states.index.get(&after)?;
                    Some(replaced(&values, g, to))
                });
                part.ours.push(decided.unwrap_or(NONE));
            }
            let start = part.departures.len();
            for g in 0..k {
                for to in &leaving[values[g]] {
                    let d = replaced(&values, g, *to);
                    match part.departures[start..].iter_mut().find(|(s, _)| *s == d) {
                        Some((_, many)) => *many += 1,
                        None => part.departures.push((d, 1)),
                    }
                }
            }
            part.departure_at.push(part.departures.len() as u32);
        }
        part
    }
}

/// Where our order places `wanted` on GPUs in states `sets` (by position): whole GPUs on the
/// first empty GPU, MIG devices through `packing::order`.
pub(super) fn ours(gpus: &[Gpu], sets: &[Vec<Held>], wanted: &Wanted) -> Option<(usize, Held)> {
    let profile = match wanted {
        Wanted::WholeGpu => {
            let g = sets.iter().position(|s| s.is_empty())?;
            return Some((g, WHOLE));
        }
        Wanted::Profile(name) => gpus
            .first()?
            .mig
            .as_ref()?
            .profiles
            .iter()
            .find(|p| &p.name == name)?,
    };
    let gpu_refs: Vec<&Gpu> = gpus.iter().collect();
    let set_refs: Vec<&[Held]> = sets.iter().map(Vec::as_slice).collect();
    super::pair::packed_choice(&gpu_refs, &set_refs, profile)
}

/// Name order's choice: the fitting device whose name sorts first.
pub(super) fn by_name(gpus: &[Gpu], sets: &[Vec<Held>], wanted: &Wanted) -> Option<(usize, Held)> {
    let Wanted::Profile(profile_name) = wanted else {
        return ours(gpus, sets, wanted);
    };
    (0..gpus.len())
        .flat_map(|g| {
            super::fitting(&gpus[g], &sets[g], wanted)
                .into_iter()
                .map(move |h| (g, h))
        })
        .min_by_key(|(g, h)| mig_device_name(gpus[*g].minor, profile_name, h.0, h.1))
}

/// Where ours loses to the best order, exactly: per node state and request where ours decides
/// otherwise than the best order, the state's long-run share under ours × the request's share
/// × how much more ours' decision costs (in the best order's relative values). These terms add
/// up to ours' failures per arrival minus the best's, so the largest of them say which decisions
/// make the gap. Returns the gap and the `top` largest terms, described.
#[cfg(all(test, feature = "experiments"))]
pub(super) fn disagreements(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
    max_states: usize,
    top: usize,
) -> Option<(ManyRates, Vec<String>)> {
    let first = gpus.first()?;
    let total: f64 = mix.iter().map(|(_, w)| w).sum();
    let weights: Vec<f64> = mix.iter().map(|(_, w)| w / total).collect();
    let one = Gpus::solve(first, mix, mean_lifetime, max_states)?;
    let node = Node::build(gpus, &one, mix, mean_lifetime, max_states)?;
    let requests = node.requests;
    let count = node.ours.len() / requests;
    let (best, h) = node.relative_values(&weights, false);
    let ours = node.failures_per_arrival(&weights, true);
    // Ours' stationary distribution, by power iteration on the uniformized chain.
    let arrive = 1.0 / node.rate;
    let leave = node.leave_rate / node.rate;
    let mut pi = vec![1.0 / count as f64; count];
    let mut next = vec![0.0; count];
    for _ in 0..200_000 {
        next.iter_mut().for_each(|x| *x = 0.0);
        for s in 0..count {
            let mass = pi[s];
            let mut stay = 1.0 - arrive;
            for (r, w) in weights.iter().enumerate() {
                match node.ours[s * requests + r] {
                    NONE => stay += arrive * w,
                    d => next[d as usize] += mass * arrive * w,
                }
            }
            let (from, to) = (
                node.departure_at[s] as usize,
                node.departure_at[s + 1] as usize,
            );
            for (d, many) in &node.departures[from..to] {
                let p = leave * f64::from(*many);
                next[*d as usize] += mass * p;
                stay -= p;
            }
            next[s] += mass * stay;
        }
        let change: f64 = pi.iter().zip(&next).map(|(a, b)| (a - b).abs()).sum();
        std::mem::swap(&mut pi, &mut next);
        if change < 1e-11 {
            break;
        }
    }
    let ranks = Multisets::new(one.states.sets.len(), gpus.len());
    let describe = |s: usize| -> String {
        let mut values = vec![0usize; gpus.len()];
        ranks.unrank(s, &mut values);
        values
            .iter()
            .map(|v| {
                let set = &one.states.sets[*v];
                if set.is_empty() {
                    return "-".to_string();
                }
                set.iter()
                    .map(|(id, start)| {
                        let name = first
                            .mig
                            .as_ref()
                            .and_then(|m| m.profile_by_id(*id))
                            .map_or("gpu".to_string(), |p| p.name.clone());
                        format!("{name}@{start}")
                    })
                    .collect::<Vec<_>>()
                    .join("+")
            })
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let mut terms: Vec<(f64, usize, usize, u32, u32)> = Vec::new();
    for s in 0..count {
        for (r, w) in weights.iter().enumerate() {
            let at = s * requests + r;
            let (from, to) = (node.choice_at[at] as usize, node.choice_at[at + 1] as usize);
            let best_next = node.choices[from..to]
                .iter()
                .copied()
                .min_by(|a, b| h[*a as usize].total_cmp(&h[*b as usize]));
            let cost = |d: Option<u32>| d.map_or(1.0 + h[s], |d| h[d as usize]);
            let ours_next = (node.ours[at] != NONE).then_some(node.ours[at]);
            let term = pi[s] * w * (cost(ours_next) - cost(best_next));
            if term > 1e-15 {
                terms.push((term, s, r, node.ours[at], best_next.unwrap_or(NONE)));
            }
        }
    }
    terms.sort_by(|a, b| b.0.total_cmp(&a.0));
    let gap: f64 = terms.iter().map(|t| t.0).sum();
    let mut lines = vec![format!(
        "ours {:.4}%, best {:.4}%, gap {:.4} points; the decisions' terms add up to {:.4} points over {} (state, request) pairs",
        100.0 * ours,
        100.0 * best,
        100.0 * (ours - best),
        100.0 * gap,
        terms.len()
    )];
    for (term, s, r, o, b) in terms.into_iter().take(top) {
        let label = match &mix[r].0 {
            Wanted::WholeGpu => "gpu".to_string(),
            Wanted::Profile(p) => p.clone(),
        };
        let show = |d: u32| {
            if d == NONE {
                "FAIL".to_string()
            } else {
                describe(d as usize)
            }
        };
        lines.push(format!(
            "{:.4} points ({:.1}% of the gap), state share {:.4}: {label} on [{}]\n    ours → [{}]\n    best → [{}]",
            100.0 * term,
            100.0 * term / gap.max(1e-300),
            pi[s],
            describe(s),
            show(o),
            show(b),
        ));
    }
    Some((
        ManyRates {
            ours,
            best,
            states: count,
        },
        lines,
    ))
}

/// The device orders [`simulated`] replays.
#[derive(Debug, Clone, Copy)]
pub(super) enum Simulated {
    /// Ours with the GPUs' real minors.
    Ours,
    ByName,
}

/// Failures per arrival of `order` with real minors, simulated in the same continuous-time
/// model over `arrivals` arrivals (after a warm-up of a tenth as many).
pub(super) fn simulated(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
    arrivals: usize,
    seed: u64,
    order: Simulated,
) -> f64 {
    let decide = match order {
        Simulated::Ours => ours,
        Simulated::ByName => by_name,
    };
    simulated_with(gpus, mix, mean_lifetime, arrivals, seed, &decide)
}

/// Where a decision rule places a request on GPUs in states `sets` (by position).
type Decide<'a> = dyn Fn(&[Gpu], &[Vec<Held>], &Wanted) -> Option<(usize, Held)> + 'a;

/// [`simulated`] with any decision rule.
fn simulated_with(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
    arrivals: usize,
    seed: u64,
    decide: &Decide<'_>,
) -> f64 {
    let total: f64 = mix.iter().map(|(_, w)| w).sum();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut sets: Vec<Vec<Held>> = vec![Vec::new(); gpus.len()];
    let mut live: Vec<(usize, Held)> = Vec::new();
    let warm_up = arrivals / 10;
    let (mut seen, mut failed) = (0usize, 0usize);
    while seen < arrivals + warm_up {
        // Next event: an arrival (rate 1) or one of the live requests leaving.
        let leaving = live.len() as f64 / mean_lifetime;
        let pick = rng.unit() * (1.0 + leaving);
        if pick >= 1.0 && !live.is_empty() {
            let i = (((pick - 1.0) * mean_lifetime) as usize).min(live.len() - 1);
            let (g, held) = live.swap_remove(i);
            if let Some(p) = sets[g].iter().position(|h| *h == held) {
                sets[g].remove(p);
            }
            continue;
        }
        let Some(wanted) = draw(mix, total, &mut rng) else {
            return 0.0;
        };
        seen += 1;
        match decide(gpus, &sets, wanted) {
            Some((g, held)) => {
                sets[g].push(held);
                sets[g].sort_unstable();
                live.push((g, held));
            }
            None if seen > warm_up => failed += 1,
            None => {}
        }
    }
    failed as f64 / arrivals as f64
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    use crate::test_inventory as node;

    #[test]
    fn multisets_rank_and_unrank_every_state_once() {
        let ranks = Multisets::new(5, 3);
        assert_eq!(ranks.count(), 35);
        let mut values = [0usize; 3];
        for r in 0..35 {
            ranks.unrank(r, &mut values);
            assert!(values.windows(2).all(|w| w[0] <= w[1]), "{values:?}");
            assert!(values.iter().all(|v| *v < 5));
            assert_eq!(ranks.rank(&values), r);
        }
    }

    /// Erlang's loss formula: the share of arrivals that find all `servers` busy when requests
    /// of mean length `load` (in mean times between arrivals) each take one server.
    pub(crate) fn erlang_b(servers: usize, load: f64) -> f64 {
        (1..=servers).fold(1.0, |b, m| load * b / (m as f64 + load * b))
    }

    #[test]
    fn whole_gpu_requests_fail_as_erlang_says() {
        // 7g requests on three GPUs: every order is the same loss system with three servers.
        let gpus = node("3xH100-SXM5-80GB").gpus;
        let mix = vec![(Wanted::Profile("7g.80gb".into()), 1.0)];
        let rates = rates(&gpus, &mix, 2.5, 100_000).expect("rates");
        let want = erlang_b(3, 2.5);
        assert!((rates.best - want).abs() < 1e-8, "{rates:?} want {want}");
        assert!((rates.ours - want).abs() < 1e-8, "{rates:?} want {want}");
        assert_eq!(rates.states, 4);
    }

    #[test]
    fn the_best_order_is_never_worse_than_ours_and_simulation_agrees() {
        let gpus = node("3xA30-24GB").gpus;
        let mix = vec![
            (Wanted::Profile("1g.6gb".into()), 5.0),
            (Wanted::Profile("2g.12gb".into()), 3.0),
            (Wanted::Profile("4g.24gb".into()), 2.0),
        ];
        let rates = rates(&gpus, &mix, 3.0, 100_000).expect("rates");
        assert!(rates.best <= rates.ours + 1e-9, "{rates:?}");
        // Ours with real minors, simulated: within sampling error of the exact rate.
        let simulated_ours = simulated(&gpus, &mix, 3.0, 150_000, 7, Simulated::Ours);
        let by_name = simulated(&gpus, &mix, 3.0, 150_000, 7, Simulated::ByName);
        assert!(
            (simulated_ours - rates.ours).abs() < 0.01,
            "{simulated_ours} vs {rates:?}"
        );
        assert!(by_name > rates.best, "{by_name} vs {rates:?}");
    }

    /// Spreading instead of packing: each MIG request on the fitting GPU with the most free
    /// memory slices (ours' placement within it), once the node holds at least `from` of its
    /// memory slices (ours below). At heavy load the node that re-places its instances freely
    /// fails least by turning big requests away (`repacked`); spreading is how an order could
    /// do the same, by leaving no GPU empty enough for them.
    #[cfg(feature = "experiments")]
    #[test]
    #[ignore = "an experiment"]
    fn spreading_at_heavy_load() {
        let gpus = node("8xH100-SXM5-80GB").gpus;
        let mix = super::super::repacked::tests::default_mix();
        let slices = |gpu: &Gpu, set: &[Held]| -> u32 {
            set.iter()
                .filter_map(|h| {
                    let profile = gpu.mig.as_ref()?.profile_by_id(h.0)?;
                    profile
                        .placements
                        .iter()
                        .find(|pl| pl.start == h.1)
                        .map(|pl| pl.size)
                })
                .sum()
        };
        let arrivals: usize = std::env::var("ARRIVALS")
            .ok()
            .and_then(|a| a.parse().ok())
            .unwrap_or(300_000);
        for lifetime in [15.0, 20.0, 25.0, 30.0] {
            let ours_rate = simulated(&gpus, &mix, lifetime, arrivals, 1, Simulated::Ours);
            let mut line = format!("lifetime {lifetime}: ours {:.3}%", 100.0 * ours_rate);
            for from in [0u32, 40, 48, 56] {
                let decide = |gpus: &[Gpu], sets: &[Vec<Held>], wanted: &Wanted| {
                    let held: u32 = gpus.iter().zip(sets).map(|(g, s)| slices(g, s)).sum();
                    let Wanted::Profile(name) = wanted else {
                        return ours(gpus, sets, wanted);
                    };
                    if held < from {
                        return ours(gpus, sets, wanted);
                    }
                    let profile = super::super::experiment::profile_named(gpus, name)?;
                    (0..gpus.len())
                        .filter_map(|g| {
                            super::super::pair::packed_choice(&[&gpus[g]], &[&sets[g]], profile)
                                .map(|(_, h)| (g, h))
                        })
                        .min_by_key(|(g, _)| (slices(&gpus[*g], &sets[*g]), *g))
                };
                let rate = simulated_with(&gpus, &mix, lifetime, arrivals, 1, &decide);
                line += &format!(", spread from {from} slices {:.3}%", 100.0 * rate);
                // Only the empty GPUs: a MIG request takes one whenever there is one, so that
                // 7g requests find none, and is packed otherwise.
                let empty_first = |gpus: &[Gpu], sets: &[Vec<Held>], wanted: &Wanted| {
                    let held: u32 = gpus.iter().zip(sets).map(|(g, s)| slices(g, s)).sum();
                    let Wanted::Profile(name) = wanted else {
                        return ours(gpus, sets, wanted);
                    };
                    let empty = sets.iter().position(Vec::is_empty);
                    match empty {
                        Some(g) if held >= from => {
                            let profile = super::super::experiment::profile_named(gpus, name)?;
                            super::super::pair::packed_choice(&[&gpus[g]], &[&sets[g]], profile)
                                .map(|(_, h)| (g, h))
                        }
                        _ => ours(gpus, sets, wanted),
                    }
                };
                let rate = simulated_with(&gpus, &mix, lifetime, arrivals, 1, &empty_first);
                line += &format!(" (empty GPUs first {:.3}%)", 100.0 * rate);
            }
            eprintln!("{line}");
        }
    }

    /// Trunk reservation: a 7g request (a whole GPU's worth) is turned away while `R` or fewer
    /// GPUs are empty, so that the last empty GPUs take the small requests it would have cost.
    #[cfg(feature = "experiments")]
    #[test]
    #[ignore = "an experiment"]
    fn reserving_empty_gpus() {
        use super::super::repacked::tests::{DEFAULT_MIX, env_node};
        let (gpus, mix) = env_node("8xH100-SXM5-80GB", DEFAULT_MIX);
        let arrivals: usize = std::env::var("ARRIVALS")
            .ok()
            .and_then(|a| a.parse().ok())
            .unwrap_or(1_000_000);
        let mig = gpus[0].mig.as_ref().expect("MIG");
        let slices = mig
            .profiles
            .iter()
            .flat_map(|p| p.placements.iter().map(|pl| pl.end()))
            .max()
            .unwrap_or(0);
        let whole_gpu = |gpus: &[Gpu], wanted: &Wanted| match wanted {
            Wanted::WholeGpu => true,
            Wanted::Profile(name) => super::super::experiment::profile_named(gpus, name)
                .is_some_and(|p| p.placements.iter().all(|pl| pl.size == slices)),
        };
        let env_list = super::super::repacked::tests::env_list::<f64>;
        for lifetime in env_list("LIFETIMES", "15,20,25,30") {
            let ours_rate = simulated(&gpus, &mix, lifetime, arrivals, 1, Simulated::Ours);
            let mut line = format!("lifetime {lifetime}: ours {:.3}%", 100.0 * ours_rate);
            let reserves = super::super::repacked::tests::env_list::<usize>("RESERVES", "1,2,3");
            for reserve in reserves {
                let decide = |gpus: &[Gpu], sets: &[Vec<Held>], wanted: &Wanted| {
                    let empty = sets.iter().filter(|s| s.is_empty()).count();
                    if empty <= reserve && whole_gpu(gpus, wanted) {
                        return None;
                    }
                    ours(gpus, sets, wanted)
                };
                let rate = simulated_with(&gpus, &mix, lifetime, arrivals, 1, &decide);
                line += &format!(", reserve {reserve}: {:.3}%", 100.0 * rate);
            }
            eprintln!("{line}");
        }
    }

    #[test]
    fn nodes_over_the_limit_are_not_solved() {
        let gpus = node("8xH100-SXM5-80GB").gpus;
        let mix = vec![(Wanted::Profile("1g.10gb".into()), 1.0)];
        assert_eq!(rates(&gpus, &mix, 2.0, 10_000), None);
    }
}
