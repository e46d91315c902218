//! A lower bound on the best order's failures on a node of N identical GPUs, where the exact
//! solution is out of reach (8×H100 with the default mix: 2×10¹⁸ node states), in the
//! continuous-time model of [`super::many`] (arrivals at rate 1, each live request leaves at rate
//! `1 / mean_lifetime`).
//!
//! Any `g` and values `h` over node states with `g ≤ cost(s, a) + Σ rate · (h(next) − h(s))`
//! for every state `s` and every decision `a` (the Bellman inequality of the average-cost
//! process) bound the best order's failures per arrival from below: averaged over the best
//! order's own long-run state distribution, the `h` terms cancel. The values here are one GPU's
//! values added up over the GPUs plus a value of the node's totals (memory slices held, empty
//! GPUs): `h(s) = Σ_j v(s_j) + u(T(s))`, so the inequality at a node state of totals `T` reads
//!
//! `g ≤ Σ_j D_T(s_j) + Σ_r w_r A_r(s)`
//!
//! with `D_T` one GPU's departures' effect on `h`, and `A_r` what request `r` costs: the least
//! that a placement adds to `h` over the GPUs it fits, or 1 (a failure) when it fits none. The
//! least of the right side over all node states splits by totals, by the set `R` of requests
//! that fit nowhere, and by which GPU takes which of the others (a partition into blocks, one GPU
//! per block, the other GPUs idle): a min-plus convolution of per-GPU least terms over the
//! GPUs' shares of the totals. That is cheap (about a second for 8×H100 on 2 cores), so the
//! largest `g` is found by cutting planes (a proximal bundle method): a program over `v`, `u`
//! and `g` holds the node states found so far, each of its solutions is checked against every
//! node state, and the states that break it are added. Every check gives a bound that stands on
//! its own (exact arithmetic over every node state, whatever the solver's tolerance); the
//! largest is reported, with the plain program's value over the states held, the most these
//! values could prove. On one GPU the values are unrestricted and the bound is the best order's
//! rate; with 7g requests only, `u` alone is exact (Erlang's loss formula). A GPU of more than
//! [`CLASSES_FIRST`] states shares values among states of the same memory held and requests
//! that fit.
//!
//! Values that add up over GPUs cannot say everything (the exact best order's values do not add
//! up), so the bound is below the best order, the more so at light load: on 4×H100 (the default
//! mix less 1g.10gb) it is 44% of the exact best order at lifetime 3 and 93% at 12; the
//! experiments below compare other node values by brute force on small nodes. The node that
//! re-places its instances freely ([`super::repacked`]) proves more everywhere measured; the
//! study reports the higher of the two.
use std::collections::HashSet;

use clarabel::algebra::CscMatrix;
use clarabel::solver::{
    DefaultSettingsBuilder, DefaultSolver, IPSolver, NonnegativeConeT, SolverStatus, ZeroConeT,
};

use super::super::packing_study::Wanted;
use super::{Gpus, WHOLE};
use gpu_dra::gpu::Gpu;

/// The bound and what it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bound {
    /// No device order fails fewer arrivals than this, in the long run (checked exactly).
    pub(crate) best_at_least: f64,
    /// The most these values could prove (the last linear program's optimum).
    pub(crate) could_prove: f64,
    /// One GPU's states, and the values they share (one per state on small GPUs).
    pub(crate) gpu_states: usize,
    pub(crate) value_classes: usize,
    /// Rounds of cutting planes, and node states held as cuts at the end.
    pub(crate) rounds: usize,
    pub(crate) cuts: usize,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum BoundError {
    #[error("the GPUs are not identical MIG GPUs")]
    NotIdentical,
    #[error("the mix has no weight, or the mean lifetime is not positive")]
    EmptyMix,
    #[error("the mix has {0} requests; the bound enumerates subsets of at most 8")]
    TooManyRequests(usize),
    #[error("one GPU has more than {0} states")]
    TooManyStates(usize),
    #[error("a node of {0} GPUs holds more than 255 instances of one profile")]
    TooManyInstances(usize),
    #[error("the linear program was not solved: {0}")]
    NotSolved(String),
}

/// One GPU's process, for the bound.
struct One {
    /// Per state: the requests (bit `r`) with a placement there.
    fits: Vec<u32>,
    /// Per state: memory slices held.
    size: Vec<usize>,
    /// Per state: the states one departure leads to (one per live request).
    leaving: Vec<Vec<usize>>,
    /// Per state and request: the states a placement leads to.
    choices: Vec<Vec<Vec<usize>>>,
    /// Per state: its value's variable (states of a class share one), and how many there are.
    class: Vec<usize>,
    classes: usize,
}

impl One {
    fn new(gpu: &Gpu, one: &Gpus) -> Self {
        // The memory slices one live instance holds (a whole GPU: all of them).
        let all = gpu
            .mig
            .iter()
            .flat_map(|m| m.profiles.iter())
            .flat_map(|p| p.placements.iter().map(|pl| pl.end()))
            .max()
            .unwrap_or(0);
        let slices = |held: &(u32, u32)| -> usize {
            if *held == WHOLE {
                return all as usize;
            }
            gpu.mig
                .as_ref()
                .and_then(|m| m.profile_by_id(held.0))
                .and_then(|p| p.placements.iter().find(|pl| pl.start == held.1))
                .map_or(0, |pl| pl.size as usize)
        };
        let fits = one
            .choices
            .iter()
            .map(|per_request| {
                per_request
                    .iter()
                    .enumerate()
                    .filter(|(_, to)| !to.is_empty())
                    .fold(0u32, |bits, (r, _)| bits | 1 << r)
            })
            .collect();
        Self {
            fits,
            size: one
                .states
                .sets
                .iter()
                .map(|set| set.iter().map(slices).sum())
                .collect(),
            leaving: super::many::one_departure(one),
            choices: one.choices.clone(),
            class: (0..one.states.sets.len()).collect(),
            classes: one.states.sets.len(),
        }
    }

    /// States with as many memory slices held and the same requests that fit share a value:
    /// fewer variables, a bound no less valid, if weaker. On 8×H100 with the default mix (723
    /// states, 24 classes) it converges in about 30 rounds; a value per state did not in 40, and
    /// per set of slices held and instances (365 classes) took 150 rounds (15 minutes) to a
    /// program that could prove at most 5.25% at lifetime 20, against 4.81% here.
    fn by_class(mut self) -> Self {
        let mut seen: std::collections::HashMap<(usize, u32), usize> =
            std::collections::HashMap::new();
        // The empty state first, so that its class is variable 0 (the anchor).
        for s in 0..self.size.len() {
            let next = seen.len();
            self.class[s] = *seen.entry((self.size[s], self.fits[s])).or_insert(next);
        }
        self.classes = seen.len();
        self
    }
}

/// The node: `count` GPUs. A node's totals are its memory slices held (up to `most`) and its
/// empty GPUs, one index `slices × (count + 1) + empty`.
struct Node<'a> {
    one: &'a One,
    count: usize,
    largest: usize,
    most: usize,
    weights: &'a [f64],
    leave_rate: f64,
}

/// Where the variables sit: `v` per GPU state, then `u` per totals, then `g`.
impl Node<'_> {
    fn totals(&self) -> usize {
        (self.most + 1) * (self.count + 1)
    }

    fn u(&self, totals: usize) -> usize {
        self.one.classes + totals
    }

    fn g(&self) -> usize {
        self.one.classes + self.totals()
    }

    fn columns(&self) -> usize {
        self.g() + 1
    }

    /// One GPU's share of the totals.
    fn share(&self, s: usize) -> usize {
        self.one.size[s] * (self.count + 1) + usize::from(self.one.size[s] == 0)
    }

    /// The totals once GPU state `from` became `to`.
    fn moved(&self, totals: usize, from: usize, to: usize) -> usize {
        totals - self.share(from) + self.share(to)
    }

    /// `D(s)` at the node's `totals`, as a linear form.
    fn drift(&self, s: usize, totals: usize, form: &mut Vec<(usize, f64)>) {
        for to in &self.one.leaving[s] {
            let after = self.moved(totals, s, *to);
            form.extend([
                (self.one.class[*to], self.leave_rate),
                (self.one.class[s], -self.leave_rate),
                (self.u(after), self.leave_rate),
                (self.u(totals), -self.leave_rate),
            ]);
        }
    }

    /// What placing into `to` from `s` adds to `h`, as a linear form scaled by `w`.
    fn adds(&self, s: usize, to: usize, totals: usize, w: f64, form: &mut Vec<(usize, f64)>) {
        let after = self.moved(totals, s, to);
        let (to_class, from_class) = (self.one.class[to], self.one.class[s]);
        form.extend([
            (to_class, w),
            (from_class, -w),
            (self.u(after), w),
            (self.u(totals), -w),
        ]);
    }
}

fn value(form: &[(usize, f64)], x: &[f64]) -> f64 {
    form.iter().map(|(i, c)| c * x[*i]).sum()
}

/// Every partition of the bits of `set` into at most `most` nonempty blocks.
fn partitions(set: u32, most: usize) -> Vec<Vec<u32>> {
    fn grow(rest: u32, blocks: &mut Vec<u32>, most: usize, out: &mut Vec<Vec<u32>>) {
        if rest == 0 {
            out.push(blocks.clone());
            return;
        }
        let bit = rest & rest.wrapping_neg();
        for b in 0..blocks.len() {
            blocks[b] |= bit;
            grow(rest & !bit, blocks, most, out);
            blocks[b] &= !bit;
        }
        if blocks.len() < most {
            blocks.push(bit);
            grow(rest & !bit, blocks, most, out);
            blocks.pop();
        }
    }
    let mut out = Vec::new();
    grow(set, &mut Vec::new(), most, &mut out);
    out
}

/// The subsets of `set`, `set` included.
fn subsets(set: u32) -> impl Iterator<Item = u32> {
    let mut next = Some(set);
    std::iter::from_fn(move || {
        let current = next?;
        next = (current != 0).then(|| (current - 1) & set);
        Some(current)
    })
}

/// A node state that bounds `g`: its GPUs' states, which requests each takes (and where), and
/// the requests that fit nowhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Cut {
    totals: usize,
    /// Per GPU: its state and, per request it takes, the state the placement leads to.
    gpus: Vec<(usize, Vec<(usize, usize)>)>,
    failing: u32,
}

/// One GPU state's drift and, per request, its cheapest placement (what it adds, and where).
type Terms = (f64, Vec<Option<(f64, usize)>>);

/// Per kind of GPU share: the least per-GPU term and its state.
type Least = Vec<(f64, usize)>;

impl Node<'_> {
    /// The cut as a row `g − (right side's forms) ≤ Σ_{r∈R} w_r`: the forms and the constant.
    fn row(&self, cut: &Cut) -> (Vec<(usize, f64)>, f64) {
        let mut form = Vec::new();
        for (s, placed) in &cut.gpus {
            self.drift(*s, cut.totals, &mut form);
            for (r, to) in placed {
                self.adds(*s, *to, cut.totals, self.weights[*r], &mut form);
            }
        }
        let mut row: Vec<(usize, f64)> = form.into_iter().map(|(i, c)| (i, -c)).collect();
        row.push((self.g(), 1.0));
        (row, failed_weight(cut.failing, self.weights))
    }

    /// The least right side over every node state at values `x`, and the node states where it
    /// is below `target` (at most `keep`, the most violated). The node's totals are shared out
    /// among threads.
    fn check(&self, x: &[f64], target: f64, keep: usize) -> (f64, Vec<Cut>) {
        let n = self.one.size.len();
        let mut kinds: Vec<usize> = (0..n).map(|s| self.share(s)).collect();
        kinds.sort_unstable();
        kinds.dedup();
        let kind_of: Vec<usize> = (0..n)
            .map(|s| kinds.binary_search(&self.share(s)).unwrap_or(0))
            .collect();
        let workers = std::thread::available_parallelism().map_or(1, |w| w.get());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let parts: Vec<(f64, Vec<(f64, Cut)>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    let (kinds, kind_of, next) = (&kinds, &kind_of, &next);
                    scope.spawn(move || {
                        let mut least = f64::INFINITY;
                        let mut found = Vec::new();
                        loop {
                            let totals = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if totals >= self.totals() {
                                break;
                            }
                            let at =
                                self.check_totals(x, target, totals, kinds, kind_of, &mut found);
                            least = least.min(at);
                        }
                        (least, found)
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        let least = parts.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        // The most violated state per totals, so that each round reaches every part of `u`.
        let mut found: Vec<(f64, Cut)> = parts.into_iter().flat_map(|p| p.1).collect();
        found.sort_by(|a, b| a.1.totals.cmp(&b.1.totals).then(a.0.total_cmp(&b.0)));
        found.dedup_by_key(|f| f.1.totals);
        found.sort_by(|a, b| a.0.total_cmp(&b.0));
        found.truncate(keep);
        (least, found.into_iter().map(|(_, cut)| cut).collect())
    }

    /// [`Self::check`] over the node states of one `totals`: their least right side; those
    /// below `target` go to `found`.
    fn check_totals(
        &self,
        x: &[f64],
        target: f64,
        totals: usize,
        kinds: &[usize],
        kind_of: &[usize],
        found: &mut Vec<(f64, Cut)>,
    ) -> f64 {
        let one = self.one;
        let n = one.size.len();
        let requests = self.weights.len();
        let everything = (1u32 << requests) - 1;
        let radix = self.count + 1;
        let pairs = 1usize << (2 * requests);
        let (slices, empty) = (totals / radix, totals % radix);
        // Per state: its drift and, per request, the cheapest placement (value, state).
        let mut terms: Vec<Option<Terms>> = vec![None; n];
        let mut form = Vec::new();
        for (s, term) in terms.iter_mut().enumerate() {
            let (size, is_empty) = (one.size[s], usize::from(one.size[s] == 0));
            if size > slices
                || is_empty > empty
                || slices - size > (self.count - 1) * self.largest
                || empty - is_empty > self.count - 1
            {
                continue;
            }
            form.clear();
            self.drift(s, totals, &mut form);
            let drift = value(&form, x);
            let cheapest = (0..requests)
                .map(|r| {
                    one.choices[s][r]
                        .iter()
                        .map(|to| {
                            form.clear();
                            self.adds(s, *to, totals, 1.0, &mut form);
                            (value(&form, x), *to)
                        })
                        .min_by(|a, b| a.0.total_cmp(&b.0))
                })
                .collect();
            *term = Some((drift, cheapest));
        }
        // y(S, R) per kind: the least per-GPU term, and its state.
        let mut y: Vec<Least> = vec![vec![(f64::INFINITY, usize::MAX); kinds.len()]; pairs];
        for (s, term) in terms.iter().enumerate() {
            let Some((drift, cheapest)) = term else {
                continue;
            };
            let fits = one.fits[s];
            for held in subsets(fits) {
                let mut sum = *drift;
                for (r, c) in cheapest.iter().enumerate() {
                    if held & (1 << r) != 0 {
                        sum += self.weights[r] * c.map_or(f64::INFINITY, |c| c.0);
                    }
                }
                for failing in subsets(everything & !fits) {
                    let at = &mut y[pair_index(held, failing, requests)][kind_of[s]];
                    if sum < at.0 {
                        *at = (sum, s);
                    }
                }
            }
        }
        let sums = Sums {
            kinds,
            radix,
            target: totals,
        };
        let mut least = f64::INFINITY;
        for failing in subsets(everything) {
            let idle = &y[pair_index(0, failing, requests)];
            // Idle GPUs: the least over k of them, per partial totals.
            let idle_powers = sums.powers(idle, self.count);
            let fixed = failed_weight(failing, self.weights);
            for blocks in partitions(everything & !failing, self.count) {
                let vectors: Vec<&Least> = blocks
                    .iter()
                    .map(|held| &y[pair_index(*held, failing, requests)])
                    .collect();
                let Some(levels) = sums.levels(&vectors) else {
                    continue;
                };
                let idle_count = self.count - blocks.len();
                let Some((sum, at)) = sums.least(&levels, &idle_powers[idle_count]) else {
                    continue;
                };
                let value = fixed + sum;
                least = least.min(value);
                if value >= target {
                    continue;
                }
                let shares = sums.kinds_taken(&levels, &idle_powers[..=idle_count], at);
                let mut gpus: Vec<(usize, Vec<(usize, usize)>)> = blocks
                    .iter()
                    .zip(&vectors)
                    .zip(&shares)
                    .map(|((held, vector), kind)| {
                        let s = vector[*kind].1;
                        let placed = (0..requests)
                            .filter(|r| held & (1 << r) != 0)
                            .filter_map(|r| {
                                let (_, cheapest) = terms[s].as_ref()?;
                                cheapest[r].map(|(_, to)| (r, to))
                            })
                            .collect();
                        (s, placed)
                    })
                    .collect();
                gpus.extend(
                    shares[blocks.len()..]
                        .iter()
                        .map(|kind| (idle[*kind].1, Vec::new())),
                );
                found.push((
                    value,
                    Cut {
                        totals,
                        gpus,
                        failing,
                    },
                ));
            }
        }
        least
    }
}

/// Least sums over GPUs whose shares add up to `target` (totals, mixed radix).
struct Sums<'a> {
    kinds: &'a [usize],
    radix: usize,
    target: usize,
}

/// Per partial totals: the least sum over the GPUs so far, and the kind the last one took.
struct Level {
    value: Vec<f64>,
    kind: Vec<u32>,
}

impl Sums<'_> {
    /// `partial + share`, if still within the target in both digits.
    fn add(&self, partial: usize, share: usize) -> Option<usize> {
        let (r, t) = (self.radix, self.target);
        let sum = partial + share;
        (sum / r <= t / r && sum % r <= t % r && partial % r + share % r < r).then_some(sum)
    }

    fn start(&self) -> Level {
        let mut value = vec![f64::INFINITY; self.target + 1];
        value[0] = 0.0;
        Level {
            value,
            kind: vec![u32::MAX; self.target + 1],
        }
    }

    /// One more GPU with per-kind terms `vector` on top of `from`.
    fn step(&self, from: &Level, vector: &Least) -> Level {
        let mut next = Level {
            value: vec![f64::INFINITY; self.target + 1],
            kind: vec![u32::MAX; self.target + 1],
        };
        for (partial, sum) in from.value.iter().enumerate() {
            if !sum.is_finite() {
                continue;
            }
            for (kind, (term, _)) in vector.iter().enumerate() {
                if !term.is_finite() {
                    continue;
                }
                let Some(at) = self.add(partial, self.kinds[kind]) else {
                    continue;
                };
                let total = sum + term;
                if total < next.value[at] {
                    next.value[at] = total;
                    next.kind[at] = kind as u32;
                }
            }
        }
        next
    }

    /// The least over `0..=count` idle GPUs, per partial totals.
    fn powers(&self, idle: &Least, count: usize) -> Vec<Level> {
        let mut out = vec![self.start()];
        for k in 0..count {
            let next = self.step(&out[k], idle);
            out.push(next);
        }
        out
    }

    /// The blocks' GPUs in turn; `None` when one of them has no state at all.
    fn levels(&self, vectors: &[&Least]) -> Option<Vec<Level>> {
        let mut levels = vec![self.start()];
        for vector in vectors {
            if vector.iter().all(|(t, _)| !t.is_finite()) {
                return None;
            }
            let next = self.step(&levels[levels.len() - 1], vector);
            levels.push(next);
        }
        Some(levels)
    }

    /// The least sum of the blocks' `levels` and the idle GPUs' `idle` at the target, and the
    /// blocks' partial totals there.
    fn least(&self, levels: &[Level], idle: &Level) -> Option<(f64, usize)> {
        let (r, t) = (self.radix, self.target);
        let blocks = levels.last()?;
        let mut best: Option<(f64, usize)> = None;
        for (at, sum) in blocks.value.iter().enumerate() {
            // The idle GPUs make up the rest, digit by digit.
            if !sum.is_finite() || at / r > t / r || at % r > t % r {
                continue;
            }
            let total = sum + idle.value[t - at];
            if total.is_finite() && best.is_none_or(|(b, _)| total < b) {
                best = Some((total, at));
            }
        }
        best
    }

    /// The kinds each GPU took for the least sum with the blocks at partial totals `at`: the
    /// blocks' first, then the idle GPUs' (`idle[k]`: k idle GPUs).
    fn kinds_taken(&self, levels: &[Level], idle: &[Level], at: usize) -> Vec<usize> {
        let mut taken = Vec::new();
        let mut partial = at;
        for level in levels[1..].iter().rev() {
            let kind = level.kind[partial] as usize;
            taken.push(kind);
            partial -= self.kinds[kind];
        }
        taken.reverse();
        let mut partial = self.target - at;
        for level in idle[1..].iter().rev() {
            let kind = level.kind[partial] as usize;
            taken.push(kind);
            partial -= self.kinds[kind];
        }
        taken
    }
}

/// `(S, R)` pairs as one index: `S` and `R` are disjoint subsets of the requests.
fn pair_index(held: u32, failing: u32, requests: usize) -> usize {
    ((failing as usize) << requests) | held as usize
}

fn failed_weight(failing: u32, weights: &[f64]) -> f64 {
    weights
        .iter()
        .enumerate()
        .filter(|(r, _)| failing & (1 << r) != 0)
        .map(|(_, w)| w)
        .sum()
}

/// The node's first GPU, if all are the same MIG GPU, and the mix's weights as shares, if any.
pub(super) fn checked<'g>(
    gpus: &'g [Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
) -> Result<(&'g Gpu, Vec<f64>), BoundError> {
    let first = gpus.first().ok_or(BoundError::NotIdentical)?;
    if first.mig.is_none() || gpus.iter().any(|g| g.mig != first.mig) {
        return Err(BoundError::NotIdentical);
    }
    let total: f64 = mix.iter().map(|(_, w)| w).sum();
    if total <= 0.0 || mean_lifetime <= 0.0 {
        return Err(BoundError::EmptyMix);
    }
    Ok((first, mix.iter().map(|(_, w)| w / total).collect()))
}

/// The bound on `gpus` (identical MIG GPUs) under `mix`, for one GPU of at most `max_states`
/// states, after at most `rounds` rounds of cutting planes.
pub(crate) fn best_order_bound(
    gpus: &[Gpu],
    mix: &[(Wanted, f64)],
    mean_lifetime: f64,
    max_states: usize,
    rounds: usize,
    progress: &mut dyn FnMut(&Bound),
) -> Result<Bound, BoundError> {
    let (first, weights) = checked(gpus, mix, mean_lifetime)?;
    let requests = mix.len();
    if requests > 8 {
        return Err(BoundError::TooManyRequests(requests));
    }
    let solved = Gpus::solve(first, mix, mean_lifetime, max_states)
        .ok_or(BoundError::TooManyStates(max_states))?;
    let mut one = One::new(first, &solved);
    let n = one.size.len();
    // A GPU of many states gets one value per class of states: hundreds of values per state
    // took the cutting planes past 40 rounds without a bound on 8×H100 (the default mix), where
    // classes converge in 30; on small GPUs per state proves a little more.
    if n > CLASSES_FIRST {
        one = one.by_class();
    }
    let largest = one.size.iter().copied().max().unwrap_or(0);
    let node = Node {
        one: &one,
        count: gpus.len(),
        largest,
        most: largest * gpus.len(),
        weights: &weights,
        leave_rate: 1.0 / mean_lifetime,
    };
    let mut cuts = Cuts::default();
    let phase = node.cutting_planes(&mut cuts, rounds, progress)?;
    Ok(Bound {
        best_at_least: phase.best,
        could_prove: phase.could_prove,
        gpu_states: n,
        value_classes: one.classes,
        rounds: phase.rounds,
        cuts: cuts.rows.len(),
    })
}

/// One GPU's states past which states share values by class.
const CLASSES_FIRST: usize = 100;

/// The node states found so far (the program's rows, whatever its variables).
#[derive(Default)]
struct Cuts {
    rows: Vec<Cut>,
    seen: HashSet<Cut>,
}

/// Where a run of cutting planes ended.
struct Phase {
    best: f64,
    could_prove: f64,
    rounds: usize,
}

impl Node<'_> {
    /// A proximal bundle method: each program keeps its solution near the best values so far
    /// (`center`), which moves only when a solution proves enough more (a serious step).
    fn cutting_planes(
        &self,
        cuts: &mut Cuts,
        rounds: usize,
        progress: &mut dyn FnMut(&Bound),
    ) -> Result<Phase, BoundError> {
        let shape = Shape {
            columns: self.columns(),
            g: self.g(),
            anchors: vec![0, self.u(0)],
        };
        let mut rows: Vec<Row> = cuts.rows.iter().map(|cut| self.row(cut)).collect();
        let mut center = vec![0.0; shape.columns];
        let (mut best, _) = self.check(&center, f64::NEG_INFINITY, 0);
        let mut rho = 1e-6;
        let mut failed = 0;
        let mut round = 0;
        while round < rounds {
            round += 1;
            let (at, model) = solve_rows(&shape, &rows, Some((&center, rho)))?;
            if model - best < 1e-7 {
                break;
            }
            let (least, found) = self.check(&at, model - 1e-9, 1000);
            if least >= best + 0.1 * (model - best) {
                best = least;
                center = at;
                failed = 0;
            } else {
                failed += 1;
                // Many null steps in a row: the model is far off; stay closer.
                if failed % 30 == 0 {
                    rho *= 2.0;
                }
            }
            let mut added = 0;
            for cut in found {
                if cuts.seen.insert(cut.clone()) {
                    rows.push(self.row(&cut));
                    cuts.rows.push(cut);
                    added += 1;
                }
            }
            progress(&Bound {
                best_at_least: best,
                could_prove: model,
                gpu_states: self.one.size.len(),
                value_classes: self.one.classes,
                rounds: round,
                cuts: rows.len(),
            });
            if added == 0 && least >= model - 1e-7 {
                break;
            }
        }
        // The most these values could prove, given the node states held: the plain program.
        let (_, could_prove) = solve_rows(&shape, &rows, None)?;
        Ok(Phase {
            best,
            could_prove,
            rounds: round,
        })
    }
}

/// A linear program's shape: `columns` variables, `g` the one to maximize, `anchors` fixed at 0.
struct Shape {
    columns: usize,
    g: usize,
    anchors: Vec<usize>,
}

/// A row `Σ coef · x ≤ constant`.
type Row = (Vec<(usize, f64)>, f64);

/// The largest `g` that the rows allow, with the other variables in a box (they are relative
/// values: only differences matter).
///
/// With a `center` and weight `rho`, the program is a proximal one: it maximizes
/// `g − rho/2 · |x − center|²`, which keeps each solution near the best values so far (a
/// proximal bundle method: far fewer rounds than plain cutting planes when the values are many).
fn solve_rows(
    shape: &Shape,
    cuts: &[Row],
    center: Option<(&[f64], f64)>,
) -> Result<(Vec<f64>, f64), BoundError> {
    const BOX: f64 = 1e2;
    let columns = shape.columns;
    let (mut rows, mut cols, mut vals, mut b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut row = 0usize;
    for fixed in &shape.anchors {
        rows.push(row);
        cols.push(*fixed);
        vals.push(1.0);
        b.push(0.0);
        row += 1;
    }
    let equalities = row;
    for c in (0..columns).filter(|c| *c != shape.g) {
        for sign in [1.0, -1.0] {
            rows.push(row);
            cols.push(c);
            vals.push(sign);
            b.push(BOX);
            row += 1;
        }
    }
    rows.push(row);
    cols.push(shape.g);
    vals.push(1.0);
    b.push(1.0);
    row += 1;
    for (form, constant) in cuts {
        for (c, v) in form {
            rows.push(row);
            cols.push(*c);
            vals.push(*v);
        }
        b.push(*constant);
        row += 1;
    }
    let a = CscMatrix::new_from_triplets(row, columns, rows, cols, vals);
    let mut q = vec![0.0; columns];
    let p = match center {
        Some((center, rho)) => {
            let diagonal: Vec<usize> = (0..columns).filter(|c| *c != shape.g).collect();
            for c in &diagonal {
                q[*c] = -rho * center[*c];
            }
            let values = vec![rho; diagonal.len()];
            CscMatrix::new_from_triplets(columns, columns, diagonal.clone(), diagonal, values)
        }
        None => CscMatrix::zeros((columns, columns)),
    };
    q[shape.g] = -1.0;
    let cones = [ZeroConeT(equalities), NonnegativeConeT(row - equalities)];
    let settings = DefaultSettingsBuilder::default()
        .verbose(false)
        .max_iter(500)
        .build()
        .map_err(|e| BoundError::NotSolved(e.to_string()))?;
    let mut solver = DefaultSolver::new(&p, &q, &a, &b, &cones, settings)
        .map_err(|e| BoundError::NotSolved(e.to_string()))?;
    solver.solve();
    match solver.solution.status {
        SolverStatus::Solved | SolverStatus::AlmostSolved => {}
        other => return Err(BoundError::NotSolved(format!("{other:?}"))),
    }
    let x = solver.solution.x.clone();
    let objective = x[shape.g];
    Ok((x, objective))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_inventory as node;

    pub(super) fn mix(entries: &[(&str, f64)]) -> Vec<(Wanted, f64)> {
        entries
            .iter()
            .map(|(p, w)| (Wanted::Profile((*p).into()), *w))
            .collect()
    }

    #[test]
    fn partitions_are_counted_by_bell_numbers() {
        assert_eq!(partitions(0b1111, 8).len(), 15);
        assert_eq!(partitions(0b11111, 8).len(), 52);
        // At most two blocks: 2^(k−1) of them.
        assert_eq!(partitions(0b1111, 2).len(), 8);
        assert_eq!(partitions(0, 3), vec![Vec::<u32>::new()]);
        assert_eq!(
            subsets(0b101).collect::<Vec<_>>(),
            vec![0b101, 0b100, 0b001, 0]
        );
    }

    #[test]
    fn on_one_gpu_the_bound_is_the_best_order() {
        let gpus = node("1xA30-24GB").gpus;
        let mix = mix(&[("1g.6gb", 5.0), ("2g.12gb", 3.0), ("4g.24gb", 2.0)]);
        let exact = super::super::many::rates(&gpus, &mix, 3.0, 100_000).expect("exact");
        let bound = best_order_bound(&gpus, &mix, 3.0, 100_000, 200, &mut |_| {}).expect("bound");
        assert!(
            (bound.best_at_least - exact.best).abs() < 1e-6,
            "{bound:?} vs {exact:?}"
        );
    }

    #[test]
    fn whole_gpu_requests_are_bounded_exactly() {
        let gpus = node("3xH100-SXM5-80GB").gpus;
        let mix = mix(&[("7g.80gb", 1.0)]);
        let exact = super::super::many::rates(&gpus, &mix, 2.5, 100_000).expect("exact");
        let bound = best_order_bound(&gpus, &mix, 2.5, 100_000, 200, &mut |_| {}).expect("bound");
        assert!(
            (bound.best_at_least - exact.best).abs() < 1e-6,
            "{bound:?} vs {exact:?}"
        );
    }

    /// Every multiset of `k` states below `n`.
    pub(super) fn multisets(n: usize, k: usize) -> Vec<Vec<usize>> {
        if k == 0 {
            return vec![Vec::new()];
        }
        multisets(n, k - 1)
            .into_iter()
            .flat_map(|m| {
                let from = m.last().copied().unwrap_or(0);
                (from..n).map(move |s| {
                    let mut next = m.clone();
                    next.push(s);
                    next
                })
            })
            .collect()
    }

    #[test]
    fn the_check_finds_the_least_over_every_node_state() {
        // Arbitrary values: the split by totals, failing requests and blocks must give exactly
        // the least right side that going through every node state gives.
        let gpus = node("3xA30-24GB").gpus;
        let mix = mix(&[("1g.6gb", 5.0), ("2g.12gb", 3.0), ("4g.24gb", 2.0)]);
        let weights = [0.5, 0.3, 0.2];
        let solved = Gpus::solve(&gpus[0], &mix, 3.0, 100_000).expect("one GPU");
        let one = One::new(&gpus[0], &solved);
        let largest = one.size.iter().copied().max().unwrap_or(0);
        let node = Node {
            one: &one,
            count: 3,
            largest,
            most: 3 * largest,
            weights: &weights,
            leave_rate: 1.0 / 3.0,
        };
        let mut seed = 7u64;
        let x: Vec<f64> = (0..node.columns())
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                ((seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 0.4
            })
            .collect();
        let (least, _) = node.check(&x, f64::NEG_INFINITY, 0);
        let mut want = f64::INFINITY;
        for state in multisets(one.size.len(), 3) {
            let totals: usize = state.iter().map(|s| node.share(*s)).sum();
            let mut form = Vec::new();
            for s in &state {
                node.drift(*s, totals, &mut form);
            }
            let mut right = value(&form, &x);
            for (r, w) in weights.iter().enumerate() {
                let cheapest = state
                    .iter()
                    .flat_map(|s| {
                        one.choices[*s][r].iter().map(|to| {
                            let mut form = Vec::new();
                            node.adds(*s, *to, totals, 1.0, &mut form);
                            value(&form, &x)
                        })
                    })
                    .fold(f64::INFINITY, f64::min);
                right += w * if cheapest.is_finite() { cheapest } else { 1.0 };
            }
            want = want.min(right);
        }
        assert!((least - want).abs() < 1e-12, "{least} vs {want}");
    }

    #[test]
    fn on_three_gpus_the_bound_is_below_the_best_order() {
        let gpus = node("3xA30-24GB").gpus;
        let mix = mix(&[("1g.6gb", 5.0), ("2g.12gb", 3.0), ("4g.24gb", 2.0)]);
        let exact = super::super::many::rates(&gpus, &mix, 3.0, 100_000).expect("exact");
        let bound = best_order_bound(&gpus, &mix, 3.0, 100_000, 200, &mut |_| {}).expect("bound");
        assert!(
            bound.best_at_least <= exact.best + 1e-9,
            "{bound:?} vs {exact:?}"
        );
        // Values that add up over GPUs prove most of it here (0.0593 of 0.0709).
        assert!(
            bound.best_at_least > 0.8 * exact.best,
            "{bound:?} vs {exact:?}"
        );
    }
}

/// Which node values are worth a separable check: the same bound by brute force over every
/// node state (small nodes only), with `u` over any feature of the node's GPU states.
#[cfg(all(test, feature = "experiments"))]
mod experiment {
    use std::collections::HashMap;

    use super::tests::{mix, multisets};
    use super::*;
    use crate::test_inventory as node;

    type Key = Vec<u64>;

    fn brute(
        spec: &str,
        mix: &[(Wanted, f64)],
        lifetime: f64,
        feature: &dyn Fn(&One, &[usize]) -> Key,
    ) -> (f64, f64, usize) {
        let gpus = node(spec).gpus;
        let total: f64 = mix.iter().map(|(_, w)| w).sum();
        let weights: Vec<f64> = mix.iter().map(|(_, w)| w / total).collect();
        let solved = Gpus::solve(&gpus[0], mix, lifetime, 100_000).expect("one GPU");
        let one = One::new(&gpus[0], &solved);
        let n = one.size.len();
        let states = multisets(n, gpus.len());
        let mut keys: HashMap<Key, usize> = HashMap::new();
        let mut key_of = |state: &[usize]| -> usize {
            let mut sorted = state.to_vec();
            sorted.sort_unstable();
            let key = feature(&one, &sorted);
            let next = keys.len();
            *keys.entry(key).or_insert(next)
        };
        for state in &states {
            key_of(state);
        }
        // Neighbours' keys, per state: departures and placements.
        let features = keys.len();
        let key_of = |state: &[usize]| -> usize {
            let mut sorted = state.to_vec();
            sorted.sort_unstable();
            keys[&feature(&one, &sorted)]
        };
        let g = n + features;
        let shape = Shape {
            columns: g + 1,
            g,
            anchors: vec![0, n],
        };
        let leave = 1.0 / lifetime;
        let mut rows: Vec<Row> = Vec::new();
        let mut best = f64::NEG_INFINITY;
        let mut could = 1.0;
        let mut moved = vec![0usize; gpus.len()];
        for _round in 0..300 {
            let (x, objective) = solve_rows(&shape, &rows, None).expect("lp");
            could = objective;
            let mut least = f64::INFINITY;
            let mut found: Vec<(f64, Row)> = Vec::new();
            for state in &states {
                let here = key_of(state);
                let mut form: Vec<(usize, f64)> = Vec::new();
                for (j, s) in state.iter().enumerate() {
                    for to in &one.leaving[*s] {
                        moved.copy_from_slice(state);
                        moved[j] = *to;
                        let there = key_of(&moved);
                        form.extend([
                            (*to, leave),
                            (*s, -leave),
                            (n + there, leave),
                            (n + here, -leave),
                        ]);
                    }
                }
                let mut constant = 0.0;
                for (r, w) in weights.iter().enumerate() {
                    let mut cheapest: Option<(f64, [(usize, f64); 4])> = None;
                    for (j, s) in state.iter().enumerate() {
                        for to in &one.choices[*s][r] {
                            moved.copy_from_slice(state);
                            moved[j] = *to;
                            let there = key_of(&moved);
                            let terms = [(*to, *w), (*s, -w), (n + there, *w), (n + here, -w)];
                            let val = value(&terms, &x);
                            if cheapest.as_ref().is_none_or(|(b, _)| val < *b) {
                                cheapest = Some((val, terms));
                            }
                        }
                    }
                    match cheapest {
                        Some((_, terms)) => form.extend(terms),
                        None => constant += w,
                    }
                }
                let rhs = value(&form, &x) + constant;
                least = least.min(rhs);
                if rhs < objective - 1e-9 {
                    let mut row: Vec<(usize, f64)> =
                        form.into_iter().map(|(i, c)| (i, -c)).collect();
                    row.push((g, 1.0));
                    found.push((rhs, (row, constant)));
                }
            }
            best = best.max(least);
            if found.is_empty() || objective - best < 1e-7 {
                break;
            }
            found.sort_by(|a, b| a.0.total_cmp(&b.0));
            rows.extend(found.into_iter().take(400).map(|(_, row)| row));
        }
        (best, could, features)
    }

    #[test]
    #[ignore = "an experiment"]
    fn which_values() {
        let spec = std::env::var("SPEC").unwrap_or_else(|_| "3xA30-24GB".into());
        let lifetime: f64 = std::env::var("LIFETIME")
            .ok()
            .and_then(|l| l.parse().ok())
            .unwrap_or(3.0);
        let mix = match std::env::var("MIX").as_deref() {
            Ok("h100") => mix(&[
                ("1g.20gb", 45.0),
                ("2g.20gb", 20.0),
                ("3g.40gb", 20.0),
                ("4g.40gb", 8.0),
                ("7g.80gb", 7.0),
            ]),
            _ => mix(&[("1g.6gb", 5.0), ("2g.12gb", 3.0), ("4g.24gb", 2.0)]),
        };
        let gpus = node(&spec).gpus;
        let exact = super::super::many::rates(&gpus, &mix, lifetime, 3_000_000).expect("exact");
        eprintln!(
            "{spec} lifetime {lifetime}: best {:.5} ours {:.5}",
            exact.best, exact.ours
        );
        let size = |one: &One, s: usize| one.size[s] as u64;
        type Feature = Box<dyn Fn(&One, &[usize]) -> Key>;
        let features: Vec<(&str, Feature)> = vec![
            ("none", Box::new(|_, _| vec![])),
            (
                "slices and empty",
                Box::new(move |one, st| {
                    vec![
                        st.iter().map(|s| size(one, *s)).sum(),
                        st.iter().filter(|s| size(one, **s) == 0).count() as u64,
                    ]
                }),
            ),
            (
                "sizes",
                Box::new(move |one, st| {
                    let mut k: Vec<u64> = st.iter().map(|s| size(one, *s)).collect();
                    k.sort_unstable();
                    k
                }),
            ),
            (
                "fit masks",
                Box::new(|one, st| {
                    let mut k: Vec<u64> = st.iter().map(|s| u64::from(one.fits[*s])).collect();
                    k.sort_unstable();
                    k
                }),
            ),
            (
                "sizes and fits",
                Box::new(move |one, st| {
                    let mut k: Vec<u64> = st
                        .iter()
                        .map(|s| size(one, *s) * 256 + u64::from(one.fits[*s]))
                        .collect();
                    k.sort_unstable();
                    k
                }),
            ),
            (
                "slices and fits union count",
                Box::new(move |one, st| {
                    let mut k = vec![st.iter().map(|s| size(one, *s)).sum::<u64>()];
                    for r in 0..8 {
                        k.push(st.iter().filter(|s| one.fits[**s] & (1 << r) != 0).count() as u64);
                    }
                    k
                }),
            ),
        ];
        for (name, feature) in &features {
            let (bound, could, count) = brute(&spec, &mix, lifetime, feature.as_ref());
            eprintln!(
                "{name:>28}: bound {bound:.5} ({:.1}% of best) could {could:.5}, {count} values",
                100.0 * bound / exact.best
            );
        }
    }
}

#[cfg(all(test, feature = "experiments"))]
mod timing {
    use super::*;
    use crate::test_inventory as node;

    #[test]
    #[ignore = "an experiment"]
    fn bound_on_a_node() {
        let spec = std::env::var("SPEC").unwrap_or_else(|_| "4xH100-SXM5-80GB".into());
        let mix: Vec<(Wanted, f64)> = std::env::var("MIX")
            .unwrap_or_else(|_| "1g.20gb=45,2g.20gb=20,3g.40gb=20,4g.40gb=8,7g.80gb=7".into())
            .split(',')
            .map(|e| {
                let (p, w) = e.split_once('=').expect("NAME=WEIGHT");
                (Wanted::Profile(p.into()), w.parse().expect("weight"))
            })
            .collect();
        let rounds: usize = std::env::var("ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(200);
        let gpus = node(&spec).gpus;
        for lifetime in std::env::var("LIFETIMES")
            .unwrap_or_else(|_| "6".into())
            .split(',')
        {
            let lifetime: f64 = lifetime.parse().expect("lifetime");
            let started = std::time::Instant::now();
            let bound = best_order_bound(&gpus, &mix, lifetime, 100_000, rounds, &mut |b| {
                eprintln!("  {b:?} at {:.1} s", started.elapsed().as_secs_f64())
            })
            .expect("bound");
            eprintln!(
                "{spec} lifetime {lifetime}: {bound:?} in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
}
