//! The best order on a node of two identical GPUs: the process's states are pairs of one GPU's
//! states (GPU 0's, GPU 1's), so the choice of GPU is part of every decision. Name order's and
//! ours' decisions come from the same code the publication uses (`packing::order`, device
//! names), per pair of states.
use super::{FirstFit, Gpus, Held, Rates, WHOLE, fitting, live_devices, relative_update, usage_of};
use gpu_dra::gpu::mig::{gpu_device_name, mig_device_name};
use gpu_dra::gpu::{GiProfile, Gpu};
use gpu_dra::slices::DeviceOrder;
use gpu_dra::slices::packing::{self, Candidate, limits};

use super::super::packing_study::Wanted;

/// No decision: the request fails.
const NONE: u32 = u32::MAX;

/// Most pairs of states solved (an H100 with the default mix has 723 states: 522,729 pairs).
const MAX_PAIRS: usize = 1_000_000;

pub(super) fn rates(
    gpu0: &Gpu,
    gpu1: &Gpu,
    mix: &[(Wanted, f64)],
    weights: &[f64],
    mean_lifetime: f64,
    first_fit: &FirstFit<'_>,
) -> Option<Rates> {
    let one = Gpus::solve(gpu0, mix, mean_lifetime, MAX_PAIRS)?;
    let n = one.states.sets.len();
    if n * n > MAX_PAIRS {
        return None;
    }
    let gpus = [gpu0, gpu1];
    let decide = |name_order: bool| -> Vec<u32> {
        let mut out = vec![NONE; n * n * mix.len()];
        let workers = std::thread::available_parallelism().map_or(1, |w| w.get());
        let chunk = (n * n).div_ceil(workers).max(1) * mix.len();
        std::thread::scope(|scope| {
            for (c, slot) in out.chunks_mut(chunk).enumerate() {
                let one = &one;
                scope.spawn(move || {
                    for (i, cell) in slot.iter_mut().enumerate() {
                        let at = c * chunk + i;
                        let (pair, r) = (at / mix.len(), at % mix.len());
                        *cell = decision(one, gpus, pair / n, pair % n, &mix[r].0, name_order)
                            .map_or(NONE, |p| p as u32);
                    }
                });
            }
        });
        out
    };
    let by_name = decide(true);
    let ours = decide(false);
    // The decisions must be the study's (which the allocator checks): every 101st one.
    for (decisions, order) in [(&by_name, DeviceOrder::Name), (&ours, DeviceOrder::Packed)] {
        for at in (0..decisions.len()).step_by(101) {
            let (pair, r) = (at / mix.len(), at % mix.len());
            let (a, b) = (pair / n, pair % n);
            let mut live = live_devices(gpu0, &one.states.sets[a]);
            let first = live.len();
            for (i, device) in live_devices(gpu1, &one.states.sets[b])
                .into_values()
                .enumerate()
            {
                live.insert(first + i, device);
            }
            let wanted = first_fit(&live, &mix[r].0, order);
            let decided = (decisions[at] != NONE)
                .then(|| device_added(&one, gpus, a, b, decisions[at] as usize))
                .flatten();
            if wanted != decided {
                tracing::warn!(
                    ?order,
                    a,
                    b,
                    request = r,
                    ?wanted,
                    ?decided,
                    "pair decision differs from the study's first fit"
                );
                return None;
            }
        }
    }
    let solve = |policy: Option<&[u32]>| average_cost(&one, weights, policy);
    Some(Rates {
        by_name: solve(Some(&by_name)),
        ours: solve(Some(&ours)),
        best: solve(None),
    })
}

/// The pair a device order leads to from GPU states `a` and `b` for a request, or `None` when
/// it fails.
fn decision(
    one: &Gpus,
    gpus: [&Gpu; 2],
    a: usize,
    b: usize,
    wanted: &Wanted,
    name_order: bool,
) -> Option<usize> {
    let sets = [&one.states.sets[a], &one.states.sets[b]];
    let n = one.states.sets.len();
    let after = |g: usize, held: Held| -> Option<usize> {
        let mut set = sets[g].clone();
        set.push(held);
        set.sort_unstable();
        let i = *one.states.index.get(&set)?;
        Some(if g == 0 { i * n + b } else { a * n + i })
    };
    let profile = match wanted {
        // Both orders list whole GPUs by minor.
        Wanted::WholeGpu => {
            let g = (0..2).find(|g| sets[*g].is_empty())?;
            return after(g, WHOLE);
        }
        Wanted::Profile(name) => gpus[0]
            .mig
            .as_ref()?
            .profiles
            .iter()
            .find(|p| &p.name == name)?,
    };
    if name_order {
        let (g, held) = (0..2)
            .flat_map(|g| {
                fitting(gpus[g], sets[g], wanted)
                    .into_iter()
                    .map(move |h| (g, h))
            })
            .min_by_key(|(g, h)| mig_device_name(gpus[*g].minor, &profile.name, h.0, h.1))?;
        return after(g, held);
    }
    let (g, held) = packed_choice(&gpus, &sets.map(Vec::as_slice), profile)?;
    after(g, held)
}

/// Where our order (`packing::order`) places `profile` on GPUs in states `sets` (one per GPU,
/// by position): the GPU's position and what it adds, or `None` when nothing fits.
pub(super) fn packed_choice(
    gpus: &[&Gpu],
    sets: &[&[Held]],
    profile: &GiProfile,
) -> Option<(usize, Held)> {
    let at = |gpu: &Gpu| gpus.iter().position(|g| g.minor == gpu.minor);
    let mut candidates: Vec<Candidate> = gpus
        .iter()
        .flat_map(|gpu| {
            profile.placements.iter().map(move |placement| Candidate {
                gpu,
                profile,
                placement: *placement,
            })
        })
        .collect();
    packing::order(&mut candidates, |gpu| {
        at(gpu).map_or_else(Default::default, |g| usage_of(gpu, sets[g]))
    });
    let chosen = candidates.iter().find(|c| {
        at(c.gpu).is_some_and(|g| {
            !sets[g].contains(&WHOLE)
                && usage_of(c.gpu, sets[g]).fits(&limits(c.gpu), profile, c.placement)
        })
    })?;
    Some((at(chosen.gpu)?, (profile.id, chosen.placement.start)))
}

/// The device a decision from `(a, b)` to `pair` added.
fn device_added(one: &Gpus, gpus: [&Gpu; 2], a: usize, b: usize, pair: usize) -> Option<String> {
    let n = one.states.sets.len();
    let (g, before, after) = if pair / n != a {
        (0, a, pair / n)
    } else {
        (1, b, pair % n)
    };
    let added = one.states.sets[after]
        .iter()
        .find(|h| !one.states.sets[before].contains(h))?;
    if *added == WHOLE {
        return Some(gpu_device_name(gpus[g].minor));
    }
    let profile = gpus[g].mig.as_ref()?.profile_by_id(added.0)?;
    Some(mig_device_name(
        gpus[g].minor,
        &profile.name,
        profile.id,
        added.1,
    ))
}

/// Long-run failures per arrival on the pair process (relative value iteration); `policy`
/// `None`: the cheapest choice each time.
fn average_cost(one: &Gpus, weights: &[f64], policy: Option<&[u32]>) -> f64 {
    pair_values(one, weights, policy).0
}

/// The gain and the relative values of the pair process's post-decision states (`a * n + b`).
pub(super) fn pair_values(one: &Gpus, weights: &[f64], policy: Option<&[u32]>) -> (f64, Vec<f64>) {
    let n = one.states.sets.len();
    let requests = weights.len();
    let mut h = vec![0.0f64; n * n];
    let mut decided = vec![0.0f64; n * n];
    let mut half = vec![0.0f64; n * n];
    let mut next = vec![0.0f64; n * n];
    let mut gain = 0.0;
    for _ in 0..20_000 {
        for a in 0..n {
            for b in 0..n {
                let pair = a * n + b;
                let mut cost = 0.0;
                for (r, w) in weights.iter().enumerate() {
                    let to = match policy {
                        Some(p) => {
                            let d = p[pair * requests + r];
                            (d != NONE).then(|| h[d as usize])
                        }
                        None => one.choices[a][r]
                            .iter()
                            .map(|a2| h[a2 * n + b])
                            .chain(one.choices[b][r].iter().map(|b2| h[a * n + b2]))
                            .min_by(f64::total_cmp),
                    };
                    cost += w * to.unwrap_or(1.0 + h[pair]);
                }
                decided[pair] = cost;
            }
        }
        // Departures on GPU 1, then on GPU 0.
        for a in 0..n {
            for b in 0..n {
                half[a * n + b] = one.departures[b]
                    .iter()
                    .map(|(b2, p)| p * decided[a * n + b2])
                    .sum();
            }
        }
        for a in 0..n {
            for b in 0..n {
                next[a * n + b] = one.departures[a]
                    .iter()
                    .map(|(a2, p)| p * half[a2 * n + b])
                    .sum();
            }
        }
        let (estimate, span) = relative_update(&mut h, &next);
        gain = estimate;
        if span < 1e-10 {
            break;
        }
    }
    (gain, h)
}
