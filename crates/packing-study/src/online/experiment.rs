//! Experiments (ignored tests, run by hand) on a node of 8 H100s with the default mix: can a
//! device order beat `packing::order` there? Tried: a separable value policy (one GPU's exact
//! relative values, at several loads), values fitted to simulated futures (approximate policy
//! iteration), a lookahead over sampled futures (rollout), variants of the order's keys,
//! mix-weighted room, whole GPUs from the top minor, small and big slices on separate GPUs,
//! values over pairs of GPUs (the two-GPU best order's), weighted orders (room lost, instances,
//! largest free placement) from a random search, checked on fresh seeds.
//! None beat it beyond seed noise (docs/benchmarks.md, "MIG packing"). `many_gpus` solves the best order
//! exactly on nodes of four to six GPUs instead: ours is within 3% of it there. Run with
//! `cargo test --release -p gpu-dra-packing-study --features experiments online::experiment
//! -- --ignored --nocapture` (behind a feature: the suite runs ignored tests too, and these take
//! minutes in a debug build).
use super::super::packing_study::{Mix, Rng, Wanted, trace};
use super::many::by_name;
use super::{Gpus, Held, WHOLE, fitting, relative_values, usage_of};
use gpu_dra::gpu::Gpu;
use gpu_dra::gpu::sim::SimNode;
use gpu_dra::slices::packing::limits;

/// A placement policy on per-GPU states: the GPU and what it adds, or `None` (the request fails).
type Decide<'a> = dyn Fn(&[Vec<Held>], &Wanted) -> Option<(usize, Held)> + 'a;

/// Ours (`super::many::ours`); with `HIGH` set, whole GPUs from the top minor down.
fn ours(gpus: &[Gpu], sets: &[Vec<Held>], wanted: &Wanted) -> Option<(usize, Held)> {
    if matches!(wanted, Wanted::WholeGpu) && std::env::var("HIGH").is_ok() {
        let g = (0..gpus.len()).rev().find(|g| sets[*g].is_empty())?;
        return Some((g, WHOLE));
    }
    super::many::ours(gpus, sets, wanted)
}

fn value(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    one: &Gpus,
    h: &[f64],
) -> Option<(usize, Held)> {
    let empty_last = std::env::var("EMPTY_LAST").is_ok();
    least_rise(gpus, sets, wanted, one, empty_last, &|g, after| {
        let before = *one.states.index.get(&sets[g])?;
        Some(h[after] - h[before])
    })
}

/// The placement whose `rise(gpu, one-GPU state after it)` is least (`None`: not a candidate);
/// with `empty_last`, empty GPUs only when nothing else fits.
fn least_rise(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    one: &Gpus,
    empty_last: bool,
    rise: &dyn Fn(usize, usize) -> Option<f64>,
) -> Option<(usize, Held)> {
    let mut best: Option<(f64, usize, Held)> = None;
    for (g, gpu) in gpus.iter().enumerate() {
        for held in fitting(gpu, &sets[g], wanted) {
            let mut after = sets[g].clone();
            after.push(held);
            after.sort_unstable();
            let Some(delta) = one.states.index.get(&after).and_then(|a| rise(g, *a)) else {
                continue;
            };
            let delta = delta
                + if empty_last && sets[g].is_empty() {
                    1e6
                } else {
                    0.0
                };
            if best.as_ref().is_none_or(|(d, _, _)| delta < d - 1e-12) {
                best = Some((delta, g, held));
            }
        }
    }
    best.map(|(_, g, h)| (g, h))
}

fn simulate(
    gpus: &[Gpu],
    arrivals: &[super::super::packing_study::Arrival],
    decide: &Decide,
) -> usize {
    walk(gpus, arrivals, decide, &mut |_, _| {})
}

/// Replays `arrivals` under `decide`; `observe` sees the GPU states after each decision and
/// whether the arrival failed. Returns the failures.
fn walk(
    gpus: &[Gpu],
    arrivals: &[super::super::packing_study::Arrival],
    decide: &Decide,
    observe: &mut dyn FnMut(&[Vec<Held>], bool),
) -> usize {
    let mut sets: Vec<Vec<Held>> = vec![Vec::new(); gpus.len()];
    let mut live: Vec<(usize, usize, Held)> = Vec::new();
    let mut failed = 0;
    for (i, arrival) in arrivals.iter().enumerate() {
        live.retain(|(leaves, g, held)| {
            if *leaves <= i {
                let set = &mut sets[*g];
                if let Some(p) = set.iter().position(|h| h == held) {
                    set.remove(p);
                }
                false
            } else {
                true
            }
        });
        let placed = decide(&sets, &arrival.wanted);
        match placed {
            Some((g, held)) => {
                sets[g].push(held);
                sets[g].sort_unstable();
                live.push((arrival.leaves_at, g, held));
            }
            None => failed += 1,
        }
        observe(&sets, placed.is_none());
    }
    failed
}

/// The study's five traces (seeds 1–5, 10,000 arrivals) at `lifetime`.
fn study_traces(lifetime: f64, mix: &Mix) -> Vec<Vec<super::super::packing_study::Arrival>> {
    (1..=5u64)
        .map(|seed| trace(10_000, seed, lifetime, mix))
        .collect()
}

/// Failed arrivals under `decide` over `traces`, in %.
fn failed_percent(
    gpus: &[Gpu],
    traces: &[Vec<super::super::packing_study::Arrival>],
    decide: &Decide,
) -> f64 {
    let arrivals: usize = traces.iter().map(Vec::len).sum();
    let failed: usize = traces.iter().map(|t| simulate(gpus, t, decide)).sum();
    100.0 * failed as f64 / arrivals as f64
}

/// The MIG profile named `name` on the node's (identical) GPUs.
pub(super) fn profile_named<'a>(
    gpus: &'a [Gpu],
    name: &str,
) -> Option<&'a gpu_dra::gpu::GiProfile> {
    gpus.first()?
        .mig
        .as_ref()?
        .profiles
        .iter()
        .find(|p| p.name == name)
}

/// Each request's share of the mix's arrivals.
fn shares(mix: &Mix) -> Vec<f64> {
    let total: f64 = mix.entries.iter().map(|(_, w)| w).sum();
    mix.entries.iter().map(|(_, w)| w / total).collect()
}

/// Comma-separated numbers from environment variable `key`, or from `default`.
fn env(key: &str, default: &str) -> Vec<f64> {
    std::env::var(key)
        .unwrap_or(default.into())
        .split(',')
        .map(|f| f.parse().expect("number"))
        .collect()
}

/// The GPUs of a sim spec.
fn sim_gpus(spec: &str) -> Vec<Gpu> {
    SimNode::new(spec.parse().expect("spec"), "n", None)
        .inventory()
        .expect("inventory")
        .gpus
}

/// `MIX` (`profile=weight,...`, `gpu` for a whole GPU), or `default`.
fn env_mix(default: &str) -> Vec<(Wanted, f64)> {
    std::env::var("MIX")
        .unwrap_or(default.into())
        .split(',')
        .map(|part| {
            let (name, weight) = part.split_once('=').expect("NAME=WEIGHT");
            let wanted = if name == "gpu" {
                Wanted::WholeGpu
            } else {
                Wanted::Profile(name.into())
            };
            (wanted, weight.parse().expect("weight"))
        })
        .collect()
}

/// GPUS H100s (8 unless set) and the study's default mix.
fn setup() -> (usize, Vec<Gpu>, Mix) {
    let n: usize = std::env::var("GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let base = SimNode::new(
        format!("{n}xH100-SXM5-80GB").parse().expect("spec"),
        "n",
        None,
    )
    .inventory()
    .expect("inventory");
    let gpus = base.gpus.clone();
    let mix = Mix {
        name: "default".into(),
        entries: vec![
            (Wanted::Profile("1g.10gb".into()), 35.0),
            (Wanted::Profile("1g.20gb".into()), 10.0),
            (Wanted::Profile("2g.20gb".into()), 20.0),
            (Wanted::Profile("3g.40gb".into()), 20.0),
            (Wanted::Profile("4g.40gb".into()), 8.0),
            (Wanted::Profile("7g.80gb".into()), 7.0),
        ],
    };
    (n, gpus, mix)
}

#[test]
#[ignore]
fn separable_value_policy() {
    let (n, gpus, mix) = setup();
    let weights = shares(&mix);
    let factors = env("FACTORS", "1");
    let lifetimes = env("LIFETIMES", "15,20,25,30");
    for lifetime in lifetimes {
        let traces = study_traces(lifetime, &mix);
        let arrivals: usize = traces.iter().map(Vec::len).sum();
        println!(
            "lifetime {lifetime}: ours {:.2}%",
            failed_percent(&gpus, &traces, &|s, w| ours(&gpus, s, w))
        );
        for factor in &factors {
            let per_gpu = lifetime * factor / n as f64;
            let one = Gpus::solve(&gpus[0], &mix.entries, per_gpu, 50_000).expect("solve");
            let (gain, h) = relative_values(&one.choices, &one.departures, &weights, None);
            let failed: usize = traces
                .iter()
                .map(|t| simulate(&gpus, t, &|s, w| value(&gpus, s, w, &one, &h)))
                .sum();
            println!(
                "  factor {factor} (one GPU at {per_gpu:.2}: {:.2}%): value {:.2}%",
                100.0 * gain,
                100.0 * failed as f64 / arrivals as f64
            );
        }
    }
}

/// Per-GPU state values fitted to the discounted future failures under `policy`.
fn fit(
    gpus: &[Gpu],
    one: &Gpus,
    arrivals: &[super::super::packing_study::Arrival],
    decide: &Decide,
    gamma: f64,
    ridge: f64,
) -> Vec<f64> {
    let n = one.states.sets.len();
    let mut features: Vec<Vec<usize>> = Vec::new();
    let mut fails: Vec<f64> = Vec::new();
    walk(gpus, arrivals, decide, &mut |sets, failed| {
        fails.push(if failed { 1.0 } else { 0.0 });
        features.push(sets.iter().map(|s| one.states.index[s]).collect());
    });
    // Discounted future failures after each decision.
    let mut target = vec![0.0; fails.len()];
    let mut acc = 0.0;
    for t in (0..fails.len()).rev() {
        target[t] = acc;
        acc = fails[t] + gamma * acc;
    }
    let mut a = vec![0.0f64; n * n];
    let mut b = vec![0.0f64; n];
    let skip = 1000;
    for t in skip..features.len().saturating_sub(2000) {
        let f = &features[t];
        for &i in f {
            b[i] += target[t];
            for &j in f {
                a[i * n + j] += 1.0;
            }
        }
    }
    for i in 0..n {
        a[i * n + i] += ridge;
    }
    // Gaussian elimination (symmetric positive definite).
    for k in 0..n {
        let p = a[k * n + k];
        for i in k + 1..n {
            let f = a[i * n + k] / p;
            if f == 0.0 {
                continue;
            }
            for j in k..n {
                a[i * n + j] -= f * a[k * n + j];
            }
            b[i] -= f * b[k];
        }
    }
    let mut x = vec![0.0; n];
    for k in (0..n).rev() {
        let mut s = b[k];
        for j in k + 1..n {
            s -= a[k * n + j] * x[j];
        }
        x[k] = s / a[k * n + k];
    }
    x
}

#[test]
#[ignore]
fn fitted_value_policy() {
    let (_, gpus, mix) = setup();
    let gammas = env("GAMMAS", "0.98");
    let rounds = env("ROUNDS", "2")[0] as usize;
    let train = env("TRAIN", "400000")[0] as usize;
    for lifetime in env("LIFETIMES", "15,20,25") {
        let one = Gpus::solve(&gpus[0], &mix.entries, lifetime, 50_000).expect("solve");
        let traces = study_traces(lifetime, &mix);
        let rate = |decide: &Decide| failed_percent(&gpus, &traces, decide);
        println!(
            "lifetime {lifetime}: ours {:.2}%",
            rate(&|s, w| ours(&gpus, s, w))
        );
        let training = trace(train, 1000, lifetime, &mix);
        for gamma in &gammas {
            let mut phi = fit(
                &gpus,
                &one,
                &training,
                &|s, w| ours(&gpus, s, w),
                *gamma,
                1.0,
            );
            for round in 0..rounds {
                let p = phi.clone();
                let got = rate(&|s, w| value(&gpus, s, w, &one, &p));
                println!("  gamma {gamma} round {round}: {got:.2}%");
                phi = fit(
                    &gpus,
                    &one,
                    &training,
                    &|s, w| value(&gpus, s, w, &one, &p),
                    *gamma,
                    1.0,
                );
            }
        }
    }
}

fn room(
    gpu: &Gpu,
    lim: &[u64; 7],
    usage: &gpu_dra::slices::packing::Usage,
    w: &dyn Fn(&gpu_dra::gpu::GiProfile) -> f64,
) -> f64 {
    gpu.mig
        .iter()
        .flat_map(|m| m.profiles.iter())
        .flat_map(|profile| profile.placements.iter().map(move |p| (profile, *p)))
        .filter(|(profile, placement)| usage.fits(lim, profile, *placement))
        .map(|(profile, placement)| f64::from(placement.size) * w(profile))
        .sum()
}

/// A candidate's GPU's used slices, and the room (weighted by `w`) the placement takes.
fn used_and_loss(candidate: &Candidate, w: &dyn Fn(&gpu_dra::gpu::GiProfile) -> f64) -> (i64, f64) {
    let Candidate {
        gpu,
        limits: lim,
        before,
        after,
        ..
    } = candidate;
    (
        i64::from(before.used_slices()),
        room(gpu, lim, before, w) - room(gpu, lim, after, w),
    )
}

fn keyed(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    variant: u32,
    w: &dyn Fn(&gpu_dra::gpu::GiProfile) -> f64,
) -> Option<(usize, Held)> {
    least_key(gpus, sets, wanted, |candidate| {
        let (used, loss) = used_and_loss(candidate, w);
        let loss = (loss * 1000.0).round() as i64;
        match variant {
            0 => (used == 0, loss, -used, 0),
            1 => (used == 0, -used, loss, 0),
            2 => (used == 0, loss - 1000 * used, 0, 0),
            3 => (used == 0, loss - 3000 * used, 0, 0),
            _ => (used == 0, loss + 1000 * used, 0, 0),
        }
    })
}

/// One placement a keyed order weighs: its GPU, the GPU's use before and after it.
struct Candidate<'a> {
    gpu: &'a Gpu,
    g: usize,
    instances: usize,
    limits: &'a [u64; 7],
    before: &'a gpu_dra::slices::packing::Usage,
    after: &'a gpu_dra::slices::packing::Usage,
    start: u32,
}

/// The fitting placement with the least `key` (ties to the first GPU and start); whole GPUs as
/// ours takes them.
fn least_key<K: Ord>(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    key: impl Fn(&Candidate) -> K,
) -> Option<(usize, Held)> {
    let Wanted::Profile(name) = wanted else {
        return ours(gpus, sets, wanted);
    };
    let profile = profile_named(gpus, name)?;
    let mut best: Option<(K, usize, Held)> = None;
    for (g, gpu) in gpus.iter().enumerate() {
        if sets[g].contains(&WHOLE) {
            continue;
        }
        let lim = limits(gpu);
        let usage = usage_of(gpu, &sets[g]);
        for placement in &profile.placements {
            if !usage.fits(&lim, profile, *placement) {
                continue;
            }
            let mut after = usage.clone();
            after.add(profile, *placement);
            let k = key(&Candidate {
                gpu,
                g,
                instances: sets[g].len(),
                limits: &lim,
                before: &usage,
                after: &after,
                start: placement.start,
            });
            if best.as_ref().is_none_or(|(b, _, _)| k < *b) {
                best = Some((k, g, (profile.id, placement.start)));
            }
        }
    }
    best.map(|(_, g, h)| (g, h))
}

#[test]
#[ignore]
fn key_variants() {
    let (_, gpus, mix) = setup();
    let default_mix = mix.entries.clone();
    let weight = |p: &gpu_dra::gpu::GiProfile| -> f64 {
        default_mix
            .iter()
            .find(|(w, _)| matches!(w, Wanted::Profile(n) if *n == p.name))
            .map_or(0.0, |(_, w)| *w)
    };
    // WHOLE=1: the whole-gpus mix (the default with gpu=15); HIGH=1 with it: whole GPUs from
    // the top minor down.
    let mix = if std::env::var("WHOLE").is_ok() {
        let mut entries = mix.entries.clone();
        entries.push((Wanted::WholeGpu, 15.0));
        Mix {
            name: "whole-gpus".into(),
            entries,
        }
    } else {
        mix
    };
    for lifetime in [10.0, 15.0, 20.0, 25.0, 30.0] {
        let traces = study_traces(lifetime, &mix);
        let rate = |decide: &Decide| failed_percent(&gpus, &traces, decide);
        print!(
            "lifetime {lifetime}: ours {:.2}",
            rate(&|s, w| ours(&gpus, s, w))
        );
        for v in 0..5 {
            print!(" v{v} {:.2}", rate(&|s, w| keyed(&gpus, s, w, v, &|_| 1.0)));
            print!(
                " v{v}mix {:.2}",
                rate(&|s, w| keyed(&gpus, s, w, v, &weight))
            );
        }
        println!();
    }
}

/// Ours on one GPU's states, tabulated: per state and request, the placement ours takes there
/// (`(room lost, start, next state)`), and per state and live request the state it leaves.
struct Table {
    best: Vec<Vec<Option<(i64, u32, usize)>>>,
    used: Vec<u32>,
    removed: Vec<std::collections::HashMap<Held, usize>>,
}

fn table(gpu: &Gpu, one: &Gpus, mix: &[(Wanted, f64)]) -> Table {
    let lim = limits(gpu);
    let sets = &one.states.sets;
    let mut best = Vec::new();
    let mut used = Vec::new();
    let mut removed = Vec::new();
    for set in sets {
        let usage = usage_of(gpu, set);
        used.push(if set.contains(&WHOLE) {
            7
        } else {
            usage.used_slices()
        });
        let before = room(gpu, &lim, &usage, &|_| 1.0);
        best.push(
            mix.iter()
                .map(|(wanted, _)| {
                    fitting(gpu, set, wanted)
                        .into_iter()
                        .map(|held| {
                            let mut after = set.clone();
                            after.push(held);
                            after.sort_unstable();
                            let next = one.states.index[&after];
                            let loss = if held == WHOLE {
                                0
                            } else {
                                let mut a = usage.clone();
                                let profile = gpu
                                    .mig
                                    .as_ref()
                                    .and_then(|m| m.profile_by_id(held.0))
                                    .expect("profile");
                                let placement = profile
                                    .placements
                                    .iter()
                                    .find(|p| p.start == held.1)
                                    .expect("placement");
                                a.add(profile, *placement);
                                ((before - room(gpu, &lim, &a, &|_| 1.0)) * 1000.0).round() as i64
                            };
                            (loss, held.1, next)
                        })
                        .min()
                })
                .collect(),
        );
        removed.push(
            set.iter()
                .map(|held| {
                    let mut rest = set.clone();
                    let at = rest.iter().position(|h| h == held).expect("held");
                    rest.remove(at);
                    (*held, one.states.index[&rest])
                })
                .collect(),
        );
    }
    Table {
        best,
        used,
        removed,
    }
}

/// Ours across GPUs from the table: the GPU and its next state.
fn fast_ours(t: &Table, states: &[usize], r: usize) -> Option<(usize, usize)> {
    states
        .iter()
        .enumerate()
        .filter_map(|(g, s)| {
            let (loss, start, next) = t.best[*s][r]?;
            let used = t.used[*s];
            Some(((used == 0, loss, -(used as i64), g, start), (g, next)))
        })
        .min_by_key(|(k, _)| *k)
        .map(|(_, d)| d)
}

/// Failures in `horizon` sampled arrivals under tabulated ours from GPU states `states` with
/// live requests `live` (gpu, held, steps left).
#[allow(clippy::too_many_arguments)]
fn rollout(
    t: &Table,
    one: &Gpus,
    cumulative: &[f64],
    lifetime: f64,
    states: &[usize],
    live: &[(usize, Held, usize)],
    horizon: usize,
    rng: &mut Rng,
) -> usize {
    let mut states = states.to_vec();
    let mut live = live.to_vec();
    let mut failed = 0;
    for _ in 0..horizon {
        live.retain_mut(|(g, held, left)| {
            *left -= 1;
            if *left == 0 {
                states[*g] = t.removed[states[*g]][held];
                false
            } else {
                true
            }
        });
        let u = rng.unit();
        let r = cumulative
            .iter()
            .position(|c| u < *c)
            .unwrap_or(cumulative.len() - 1);
        let life = ((-rng.unit().max(1e-12).ln() * lifetime).ceil() as usize).max(1);
        match fast_ours(t, &states, r) {
            Some((g, next)) => {
                let held = *one.states.sets[next]
                    .iter()
                    .find(|h| !one.states.sets[states[g]].contains(h))
                    .unwrap_or(&WHOLE);
                states[g] = next;
                live.push((g, held, life));
            }
            None => failed += 1,
        }
    }
    failed
}

#[test]
#[ignore]
fn rollout_policy() {
    let (_, gpus, mix) = setup();
    let samples = env("SAMPLES", "32")[0] as usize;
    let seeds = env("SEEDS", "1")[0] as u64;
    let cumulative: Vec<f64> = shares(&mix)
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w;
            Some(*acc)
        })
        .collect();
    for lifetime in env("LIFETIMES", "20") {
        let horizon = (env("HORIZON", "3")[0] * lifetime) as usize;
        let one = Gpus::solve(&gpus[0], &mix.entries, lifetime, 50_000).expect("solve");
        let t = table(&gpus[0], &one, &mix.entries);
        let (mut base_failed, mut fast_failed, mut roll_failed, mut arrivals) = (0, 0, 0, 0);
        for seed in 1..=seeds {
            let arr = trace(10_000, seed, lifetime, &mix);
            arrivals += arr.len();
            base_failed += simulate(&gpus, &arr, &|s, w| ours(&gpus, s, w));
            let request = |w: &Wanted| mix.entries.iter().position(|(x, _)| x == w).expect("r");
            // Tabulated ours and the rollout policy, on the real trace.
            for use_rollout in [false, true] {
                let mut states = vec![0usize; gpus.len()];
                let mut live: Vec<(usize, Held, usize)> = Vec::new(); // gpu, held, leaves_at
                let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
                let mut failed = 0;
                for (i, a) in arr.iter().enumerate() {
                    live.retain(|(g, held, leaves)| {
                        if *leaves <= i {
                            states[*g] = t.removed[states[*g]][held];
                            false
                        } else {
                            true
                        }
                    });
                    let r = request(&a.wanted);
                    let base = fast_ours(&t, &states, r);
                    let chosen = if let (true, Some(base)) = (use_rollout, base) {
                        // Candidates: each distinct GPU state's placements.
                        let mut cands: Vec<(usize, usize)> = Vec::new();
                        let mut seen = Vec::new();
                        for (g, s) in states.iter().enumerate() {
                            if seen.contains(s) {
                                continue;
                            }
                            seen.push(*s);
                            for held in fitting(&gpus[g], &one.states.sets[*s], &a.wanted) {
                                let mut after = one.states.sets[*s].clone();
                                after.push(held);
                                after.sort_unstable();
                                cands.push((g, one.states.index[&after]));
                            }
                        }
                        let stay = (-1.0 / lifetime).exp();
                        let mut totals = vec![0usize; cands.len()];
                        for _ in 0..samples {
                            // Common random numbers: the same future for every candidate.
                            let seed_k = rng.unit().to_bits() | 1;
                            let mut dep = Rng(seed_k ^ 0xABCD);
                            let lefts: Vec<usize> = live
                                .iter()
                                .map(|_| {
                                    let mut n = 1;
                                    while dep.unit() < stay {
                                        n += 1;
                                    }
                                    n
                                })
                                .collect();
                            let own =
                                ((-dep.unit().max(1e-12).ln() * lifetime).ceil() as usize).max(1);
                            for (c, (g, next)) in cands.iter().enumerate() {
                                let mut st = states.clone();
                                let held = *one.states.sets[*next]
                                    .iter()
                                    .find(|h| !one.states.sets[states[*g]].contains(h))
                                    .unwrap_or(&WHOLE);
                                st[*g] = *next;
                                let mut lv: Vec<(usize, Held, usize)> = live
                                    .iter()
                                    .zip(&lefts)
                                    .map(|((g, h, _), l)| (*g, *h, *l))
                                    .collect();
                                lv.push((*g, held, own));
                                let mut frng = Rng(seed_k);
                                totals[c] += rollout(
                                    &t,
                                    &one,
                                    &cumulative,
                                    lifetime,
                                    &st,
                                    &lv,
                                    horizon,
                                    &mut frng,
                                );
                            }
                        }
                        let base_total = cands
                            .iter()
                            .position(|c| *c == base)
                            .map(|i| totals[i])
                            .expect("ours among candidates");
                        let (i, best) = totals
                            .iter()
                            .enumerate()
                            .min_by_key(|(i, t)| (**t, *i))
                            .expect("c");
                        if *best < base_total {
                            Some(cands[i])
                        } else {
                            Some(base)
                        }
                    } else {
                        base
                    };
                    match chosen {
                        Some((g, next)) => {
                            let held = *one.states.sets[next]
                                .iter()
                                .find(|h| !one.states.sets[states[g]].contains(h))
                                .unwrap_or(&WHOLE);
                            states[g] = next;
                            live.push((g, held, a.leaves_at));
                        }
                        None => failed += 1,
                    }
                }
                if use_rollout {
                    roll_failed += failed;
                } else {
                    fast_failed += failed;
                }
            }
        }
        let pct = |f: usize| 100.0 * f as f64 / arrivals as f64;
        println!(
            "lifetime {lifetime}: ours {:.2}% tabulated {:.2}% rollout {:.2}%",
            pct(base_failed),
            pct(fast_failed),
            pct(roll_failed)
        );
    }
}

/// Ours, but GPUs tried in tiers by what they hold: `tiers[k]` for a request of size class `c`
/// (small: 1–2 compute slices, big: more) over GPU kinds 0 = only class `c`, 1 = both classes,
/// 2 = only the other class, 3 = empty. Ours decides within a tier.
fn segregated(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    tiers: &[&[u32]],
) -> Option<(usize, Held)> {
    let Wanted::Profile(name) = wanted else {
        return ours(gpus, sets, wanted);
    };
    let profiles = &gpus[0].mig.as_ref()?.profiles;
    let profile = profile_named(gpus, name)?;
    let small = |id: u32| profiles.iter().any(|p| p.id == id && p.slice_count <= 2);
    let class = profile.slice_count <= 2;
    let kind = |set: &Vec<Held>| -> u32 {
        if set.is_empty() {
            return 3;
        }
        let has_small = set.iter().any(|h| small(h.0));
        let has_big = set.iter().any(|h| !small(h.0));
        match (
            has_small && has_big,
            if class { has_small } else { has_big },
        ) {
            (true, _) => 1,
            (false, true) => 0,
            (false, false) => 2,
        }
    };
    for tier in tiers {
        let members: Vec<usize> = (0..gpus.len())
            .filter(|g| !sets[*g].contains(&WHOLE) && tier.contains(&kind(&sets[*g])))
            .collect();
        if members.is_empty() {
            continue;
        }
        let gpu_refs: Vec<&Gpu> = members.iter().map(|g| &gpus[*g]).collect();
        let set_refs: Vec<&[Held]> = members.iter().map(|g| sets[*g].as_slice()).collect();
        if let Some((i, held)) = super::pair::packed_choice(&gpu_refs, &set_refs, profile) {
            return Some((members[i], held));
        }
    }
    None
}

#[test]
#[ignore]
fn segregation_by_size() {
    let (_, gpus, mix) = setup();
    let variants: [(&str, &[&[u32]]); 4] = [
        ("same|mixed|other|empty", &[&[0], &[1], &[2], &[3]]),
        ("same+mixed|other|empty", &[&[0, 1], &[2], &[3]]),
        ("same|mixed+other|empty", &[&[0], &[1, 2], &[3]]),
        ("mixed|same|other|empty", &[&[1], &[0], &[2], &[3]]),
    ];
    for lifetime in env("LIFETIMES", "15,20,25") {
        let traces = study_traces(lifetime, &mix);
        let rate = |decide: &Decide| failed_percent(&gpus, &traces, decide);
        print!(
            "lifetime {lifetime}: ours {:.2}",
            rate(&|s, w| ours(&gpus, s, w))
        );
        for (name, tiers) in variants {
            print!(
                " | {name} {:.2}",
                rate(&|s, w| segregated(&gpus, s, w, tiers))
            );
        }
        println!();
    }
}

#[test]
#[ignore]
fn failures_by_profile() {
    let (_, gpus, mix) = setup();
    for lifetime in env("LIFETIMES", "15,20") {
        let mut by: std::collections::BTreeMap<String, (usize, usize, usize)> = Default::default();
        let mut slices_at_fail = vec![0usize; 200];
        for seed in 1..=5u64 {
            let arr = trace(10_000, seed, lifetime, &mix);
            for a in &arr {
                by.entry(format!("{:?}", a.wanted)).or_default().0 += 1;
            }
            let ours_fail = std::cell::RefCell::new(Vec::new());
            let d = |s: &[Vec<Held>], w: &Wanted| {
                let r = ours(&gpus, s, w);
                if r.is_none() {
                    let used: u32 = s
                        .iter()
                        .zip(&gpus)
                        .map(|(set, g)| usage_of(g, set).used_slices())
                        .sum();
                    ours_fail.borrow_mut().push((format!("{w:?}"), used));
                }
                r
            };
            simulate(&gpus, &arr, &d);
            for (w, used) in ours_fail.into_inner() {
                by.entry(w).or_default().1 += 1;
                slices_at_fail[used as usize] += 1;
            }
        }
        println!("lifetime {lifetime}: (arrivals, ours failed)");
        for (w, (n, f, _)) in &by {
            println!("  {w}: {n} {f}");
        }
        println!("  used memory slices at failures: {slices_at_fail:?}");
    }
}

/// Places where the sum over GPU pairs of the two-GPU best order's relative values rises least
/// (`h2` over pair states `a * n + b`), ties and unknown states to ours.
fn pairwise(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    one: &Gpus,
    h2: &[f64],
    empty_last: bool,
) -> Option<(usize, Held)> {
    let n = one.states.sets.len();
    let index: Option<Vec<usize>> = sets
        .iter()
        .map(|s| one.states.index.get(s).copied())
        .collect();
    let Some(index) = index else {
        return ours(gpus, sets, wanted);
    };
    let pair = |a: usize, b: usize| h2[a * n + b];
    least_rise(gpus, sets, wanted, one, empty_last, &|g, a| {
        Some(
            (0..gpus.len())
                .filter(|j| *j != g)
                .map(|j| pair(a, index[j]) - pair(index[g], index[j]))
                .sum(),
        )
    })
}

#[test]
#[ignore]
fn pairwise_value_policy() {
    let (n, gpus, mix) = setup();
    let weights = shares(&mix);
    for lifetime in env("LIFETIMES", "15,20,25") {
        let traces = study_traces(lifetime, &mix);
        println!(
            "lifetime {lifetime}: ours {:.2}%",
            failed_percent(&gpus, &traces, &|s, w| ours(&gpus, s, w))
        );
        for factor in env("FACTORS", "1") {
            // A pair of the node's GPUs sees 2/n of its arrivals.
            let per_pair = lifetime * 2.0 / n as f64 * factor;
            let one = Gpus::solve(&gpus[0], &mix.entries, per_pair, 50_000).expect("solve");
            let (gain, h2) = super::pair::pair_values(&one, &weights, None);
            for empty_last in [false, true] {
                let got = failed_percent(&gpus, &traces, &|s, w| {
                    pairwise(&gpus, s, w, &one, &h2, empty_last)
                });
                println!(
                    "  pair lifetime {per_pair:.2} (best pair {:.2}%) empty last {empty_last}: {got:.2}%",
                    100.0 * gain
                );
            }
        }
    }
}

/// A weighted order: after fitting and empty GPUs last (as ours), the least
/// `w[0]·room lost − w[1]·slices used − w[2]·instances − w[3]·largest free block left`.
fn weighted(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    w: &[f64; 4],
) -> Option<(usize, Held)> {
    let load_power = std::env::var("LOAD_POWER")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let (used, total) = gpus
        .iter()
        .zip(sets)
        .fold((0u32, 0u32), |(u, t), (gpu, set)| {
            let size = gpu
                .mig
                .iter()
                .flat_map(|m| m.profiles.iter())
                .flat_map(|p| p.placements.iter())
                .map(|pl| pl.start + pl.size)
                .max()
                .unwrap_or(0);
            let taken = if set.contains(&WHOLE) {
                size
            } else {
                usage_of(gpu, set).used_slices()
            };
            (u + taken, t + size)
        });
    let free_share = 1.0 - f64::from(used) / f64::from(total.max(1));
    least_key(gpus, sets, wanted, |c| {
        let lost =
            room(c.gpu, c.limits, c.before, &|_| 1.0) - room(c.gpu, c.limits, c.after, &|_| 1.0);
        // The largest placement of any profile that still fits.
        let block = c
            .gpu
            .mig
            .iter()
            .flat_map(|m| m.profiles.iter())
            .flat_map(|p| p.placements.iter().map(move |pl| (p, *pl)))
            .filter(|(p, pl)| c.after.fits(c.limits, p, *pl))
            .map(|(_, pl)| f64::from(pl.size))
            .fold(0.0, f64::max);
        let used = f64::from(c.before.used_slices());
        // LOAD_POWER=k: the instance and block terms scaled by the node's free share to the k.
        let scale = free_share.powf(load_power);
        let score = w[0] * lost - w[1] * used - scale * (w[2] * c.instances as f64 + w[3] * block);
        (
            c.instances == 0,
            (score * 1000.0).round() as i64,
            c.g,
            c.start,
        )
    })
}

#[test]
#[ignore]
fn weighted_search() {
    let (_, gpus, mix) = setup();
    let lifetime = env("LIFETIMES", "20")[0];
    let traces = study_traces(lifetime, &mix);
    let validation: Vec<_> = (6..=10u64)
        .map(|seed| trace(10_000, seed, lifetime, &mix))
        .collect();
    println!(
        "lifetime {lifetime}: ours {:.2}% (validation {:.2}%)",
        failed_percent(&gpus, &traces, &|s, w| ours(&gpus, s, w)),
        failed_percent(&gpus, &validation, &|s, w| ours(&gpus, s, w))
    );
    let base = [1.0, 0.01, 0.0, 0.0];
    println!(
        "  weighted {base:?}: {:.2}%",
        failed_percent(&gpus, &traces, &|s, w| weighted(&gpus, s, w, &base))
    );
    let mut rng = Rng(7);
    let mut results: Vec<(f64, [f64; 4])> = Vec::new();
    for _ in 0..env("TRIES", "40")[0] as usize {
        let mut w = [1.0; 4];
        for x in w.iter_mut().skip(1) {
            // Log-uniform magnitudes from 0.01 to 100 relative to room lost, either sign.
            let magnitude = 10f64.powf(rng.unit() * 4.0 - 2.0);
            *x = if rng.unit() < 0.75 {
                magnitude
            } else {
                -magnitude
            };
        }
        let got = failed_percent(&gpus, &traces, &|s, wanted| weighted(&gpus, s, wanted, &w));
        println!("  weighted {w:.3?}: {got:.2}%");
        results.push((got, w));
    }
    results.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (got, w) in results.iter().take(3) {
        println!(
            "  best {w:.3?}: {got:.2}%, validation {:.2}%",
            failed_percent(&gpus, &validation, &|s, wanted| weighted(
                &gpus, s, wanted, w
            ))
        );
    }
}

#[test]
#[ignore]
fn weighted_grid() {
    let (_, gpus, mix) = setup();
    let lifetimes = env("LIFETIMES", "15,20,25");
    let sets: Vec<_> = lifetimes
        .iter()
        .map(|lifetime| {
            (1..=10u64)
                .map(|seed| trace(10_000, seed, *lifetime, &mix))
                .collect::<Vec<_>>()
        })
        .collect();
    let base: Vec<f64> = sets
        .iter()
        .map(|t| failed_percent(&gpus, t, &|s, w| ours(&gpus, s, w)))
        .collect();
    println!("ours over seeds 1-10 at {lifetimes:?}: {base:.2?}");
    for used in env("USED", "0,0.25") {
        for count in env("COUNT", "0.5,0.75,1,1.25,1.5,2,3") {
            for block in env("BLOCK", "0,0.25,0.5,1") {
                let w = [1.0, used, count, block];
                let got: Vec<f64> = sets
                    .iter()
                    .map(|t| failed_percent(&gpus, t, &|s, x| weighted(&gpus, s, x, &w)))
                    .collect();
                let gain: f64 =
                    got.iter().zip(&base).map(|(g, b)| 1.0 - g / b).sum::<f64>() / got.len() as f64;
                println!("  {w:?}: {got:.2?} mean gain {:.1}%", 100.0 * gain);
            }
        }
    }
}

#[test]
#[ignore]
fn weighted_validation() {
    let (_, gpus, mix) = setup();
    let w = env("W", "1,0.25,1,0.5");
    let w = [w[0], w[1], w[2], w[3]];
    let first = env("FIRST", "11")[0] as u64;
    let seeds = env("SEEDS", "20")[0] as u64;
    for lifetime in env("LIFETIMES", "15,20,25") {
        let (mut name, mut base, mut new) = (Vec::new(), Vec::new(), Vec::new());
        for seed in first..first + seeds {
            let t = [trace(10_000, seed, lifetime, &mix)];
            name.push(failed_percent(&gpus, &t, &|s, x| by_name(&gpus, s, x)));
            base.push(failed_percent(&gpus, &t, &|s, x| ours(&gpus, s, x)));
            new.push(failed_percent(&gpus, &t, &|s, x| weighted(&gpus, s, x, &w)));
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        // Paired differences: the same traces under both orders.
        let diff: Vec<f64> = new.iter().zip(&base).map(|(a, b)| a - b).collect();
        let m = mean(&diff);
        let sd =
            (diff.iter().map(|d| (d - m).powi(2)).sum::<f64>() / (diff.len() - 1) as f64).sqrt();
        println!(
            "lifetime {lifetime}, seeds {first}-{}: name {:.3} ours {:.3} weighted {w:?} {:.3}; fewer than name: ours {:.1}%, weighted {:.1}%; weighted − ours {m:.3} ± {:.3} (95%)",
            first + seeds - 1,
            mean(&name),
            mean(&base),
            mean(&new),
            100.0 * (1.0 - mean(&base) / mean(&name)),
            100.0 * (1.0 - mean(&new) / mean(&name)),
            1.96 * sd / (diff.len() as f64).sqrt()
        );
    }
}

/// The exact best order against ours on nodes of several small GPUs (`super::many`):
/// `SPEC` (a sim spec of identical GPUs), `MIX` (`profile=weight,...`), `LIFETIMES`.
#[test]
#[ignore]
fn many_gpus() {
    let spec = std::env::var("SPEC").unwrap_or("4xA30-24GB".into());
    let gpus = sim_gpus(&spec);
    let mix = env_mix("1g.6gb=65,2g.12gb=28,4g.24gb=7");
    for lifetime in env("LIFETIMES", "2,4") {
        let started = std::time::Instant::now();
        let Some(rates) = super::many::rates(&gpus, &mix, lifetime, 20_000_000) else {
            println!("{spec} lifetime {lifetime}: too many states");
            continue;
        };
        let solved = started.elapsed();
        let simulate = |order| super::many::simulated(&gpus, &mix, lifetime, 2_000_000, 1, order);
        let ours = simulate(super::many::Simulated::Ours);
        let by_name = simulate(super::many::Simulated::ByName);
        println!(
            "{spec} lifetime {lifetime}: {} states ({:.0?}); failed %: best {:.3} ours {:.3} (simulated with minors {:.3}) name (simulated) {:.3}; ours above best {:.1}%, best below name {:.1}%, ours below name {:.1}%",
            rates.states,
            solved,
            100.0 * rates.best,
            100.0 * rates.ours,
            100.0 * ours,
            100.0 * by_name,
            100.0 * (rates.ours / rates.best - 1.0),
            100.0 * (1.0 - rates.best / by_name),
            100.0 * (1.0 - rates.ours / by_name),
        );
    }
}

/// Which of ours' decisions make its gap to the best order (`super::many::disagreements`), on
/// nodes of identical GPUs: `SPEC`, `MIX`, `LIFETIMES`, `TOP`.
#[test]
#[ignore]
fn many_disagreements() {
    let spec = std::env::var("SPEC").unwrap_or("8xH100-SXM5-80GB".into());
    let gpus = sim_gpus(&spec);
    let mix = env_mix("3g.40gb=30,4g.40gb=20,7g.80gb=30");
    let top = env("TOP", "15")[0] as usize;
    for lifetime in env("LIFETIMES", "4") {
        let Some((rates, lines)) =
            super::many::disagreements(&gpus, &mix, lifetime, 20_000_000, top)
        else {
            println!("{spec} lifetime {lifetime}: too many states");
            continue;
        };
        println!("{spec} lifetime {lifetime}: {} states", rates.states);
        for line in lines {
            println!("  {line}");
        }
    }
}

/// Empty GPUs last only while few are left: with more than `RESERVE` empty GPUs an empty GPU
/// competes with used ones on the room a placement takes (what the exact best order does on
/// 8×H100 with big slices: a 3g.40gb opens a new GPU rather than take the block a 4g.40gb needs).
/// `SLACK` (room units) lets the empty GPU win only when the used GPU's placement takes that much
/// more room. 8×H100, the default mix, the study's five traces.
#[test]
#[ignore]
fn empty_reserve() {
    let (_, gpus, mix) = setup();
    for lifetime in env("LIFETIMES", "15,20,25") {
        let traces = study_traces(lifetime, &mix);
        let rate = |decide: &Decide| failed_percent(&gpus, &traces, decide);
        print!(
            "lifetime {lifetime}: ours {:.3}",
            rate(&|s, w| ours(&gpus, s, w))
        );
        for reserve in env("RESERVES", "1,2,3,4") {
            for slack in env("SLACKS", "0,4") {
                let decide = |sets: &[Vec<Held>], w: &Wanted| {
                    let empties = sets.iter().filter(|s| s.is_empty()).count() as f64;
                    keyed_reserve(&gpus, sets, w, empties > reserve, slack as i64)
                };
                print!(" r{reserve}s{slack} {:.3}", rate(&decide));
            }
        }
        println!();
    }
}

fn keyed_reserve(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    open: bool,
    slack: i64,
) -> Option<(usize, Held)> {
    least_key(gpus, sets, wanted, |candidate| {
        let (used, loss) = used_and_loss(candidate, &|_| 1.0);
        let loss = loss.round() as i64;
        if open {
            // Empty GPUs add the slack (a bonus when negative) to the room they lose.
            (false, loss + if used == 0 { slack } else { 0 }, -used)
        } else {
            (used == 0, loss, -used)
        }
    })
}
