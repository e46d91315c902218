//! Experiments (ignored tests, run by hand) on a node of 8 H100s with the default mix: can a
//! device order beat `packing::order` there? Tried: a separable value policy (one GPU's exact
//! relative values, at several loads), values fitted to simulated futures (approximate policy
//! iteration), variants of the order's keys, mix-weighted room, whole GPUs from the top minor.
//! None beat it beyond seed noise (README, "MIG packing"). Run with
//! `cargo test --release --lib online::experiment -- --ignored --nocapture`.
use super::super::packing_study::{Mix, Wanted, trace};
use super::{Gpus, Held, WHOLE, fitting, relative_values, usage_of};
use crate::gpu::Gpu;
use crate::gpu::sim::SimNode;
use crate::slices::packing::{self, Candidate, limits};

/// A placement policy on per-GPU states: the GPU and what it adds, or `None` (the request fails).
type Decide<'a> = dyn Fn(&[Vec<Held>], &Wanted) -> Option<(usize, Held)> + 'a;

fn ours(gpus: &[Gpu], sets: &[Vec<Held>], wanted: &Wanted) -> Option<(usize, Held)> {
    let profile = match wanted {
        Wanted::WholeGpu => {
            let g = if std::env::var("HIGH").is_ok() {
                (0..gpus.len()).rev().find(|g| sets[*g].is_empty())?
            } else {
                (0..gpus.len()).find(|g| sets[*g].is_empty())?
            };
            return Some((g, WHOLE));
        }
        Wanted::Profile(name) => gpus[0]
            .mig
            .as_ref()?
            .profiles
            .iter()
            .find(|p| &p.name == name)?,
    };
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
        usage_of(gpu, &sets[gpu.minor as usize])
    });
    let chosen = candidates.iter().find(|c| {
        let set = &sets[c.gpu.minor as usize];
        !set.contains(&WHOLE) && usage_of(c.gpu, set).fits(&limits(c.gpu), profile, c.placement)
    })?;
    Some((
        chosen.gpu.minor as usize,
        (profile.id, chosen.placement.start),
    ))
}

fn value(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    one: &Gpus,
    h: &[f64],
) -> Option<(usize, Held)> {
    let mut best: Option<(f64, usize, Held)> = None;
    for (g, gpu) in gpus.iter().enumerate() {
        let Some(&before) = one.states.index.get(&sets[g]) else {
            continue;
        };
        for held in fitting(gpu, &sets[g], wanted) {
            let mut after = sets[g].clone();
            after.push(held);
            after.sort_unstable();
            let Some(&a) = one.states.index.get(&after) else {
                continue;
            };
            let delta = h[a] - h[before]
                + if std::env::var("EMPTY_LAST").is_ok() && sets[g].is_empty() {
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
    let total: f64 = mix.entries.iter().map(|(_, w)| w).sum();
    let weights: Vec<f64> = mix.entries.iter().map(|(_, w)| w / total).collect();
    let factors: Vec<f64> = std::env::var("FACTORS")
        .unwrap_or("1".into())
        .split(',')
        .map(|f| f.parse().expect("factor"))
        .collect();
    let lifetimes: Vec<f64> = std::env::var("LIFETIMES")
        .unwrap_or("15,20,25,30".into())
        .split(',')
        .map(|f| f.parse().expect("lifetime"))
        .collect();
    for lifetime in lifetimes {
        let traces: Vec<_> = (1..=5u64)
            .map(|seed| trace(10_000, seed, lifetime, &mix))
            .collect();
        let arrivals: usize = traces.iter().map(Vec::len).sum();
        let ours_failed: usize = traces
            .iter()
            .map(|t| simulate(&gpus, t, &|s, w| ours(&gpus, s, w)))
            .sum();
        println!(
            "lifetime {lifetime}: ours {:.2}%",
            100.0 * ours_failed as f64 / arrivals as f64
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
    let env = |k: &str, d: &str| -> Vec<f64> {
        std::env::var(k)
            .unwrap_or(d.into())
            .split(',')
            .map(|f| f.parse().expect("number"))
            .collect()
    };
    let gammas = env("GAMMAS", "0.98");
    let rounds = env("ROUNDS", "2")[0] as usize;
    let train = env("TRAIN", "400000")[0] as usize;
    for lifetime in env("LIFETIMES", "15,20,25") {
        let one = Gpus::solve(&gpus[0], &mix.entries, lifetime, 50_000).expect("solve");
        let traces: Vec<_> = (1..=5u64)
            .map(|seed| trace(10_000, seed, lifetime, &mix))
            .collect();
        let arrivals: usize = traces.iter().map(Vec::len).sum();
        let rate = |decide: &Decide| {
            let failed: usize = traces.iter().map(|t| simulate(&gpus, t, decide)).sum();
            100.0 * failed as f64 / arrivals as f64
        };
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
    usage: &crate::slices::packing::Usage,
    w: &dyn Fn(&crate::gpu::GiProfile) -> f64,
) -> f64 {
    gpu.mig
        .iter()
        .flat_map(|m| m.profiles.iter())
        .flat_map(|profile| profile.placements.iter().map(move |p| (profile, *p)))
        .filter(|(profile, placement)| usage.fits(lim, profile, *placement))
        .map(|(profile, placement)| f64::from(placement.size) * w(profile))
        .sum()
}

fn keyed(
    gpus: &[Gpu],
    sets: &[Vec<Held>],
    wanted: &Wanted,
    variant: u32,
    w: &dyn Fn(&crate::gpu::GiProfile) -> f64,
) -> Option<(usize, Held)> {
    let profile = match wanted {
        Wanted::WholeGpu => {
            let g = (0..gpus.len()).find(|g| sets[*g].is_empty())?;
            return Some((g, WHOLE));
        }
        Wanted::Profile(name) => gpus[0]
            .mig
            .as_ref()?
            .profiles
            .iter()
            .find(|p| &p.name == name)?,
    };
    type Key = (bool, i64, i64, i64);
    let mut best: Option<(Key, usize, Held)> = None;
    for (g, gpu) in gpus.iter().enumerate() {
        if sets[g].contains(&WHOLE) {
            continue;
        }
        let lim = limits(gpu);
        let usage = usage_of(gpu, &sets[g]);
        let room_before = room(gpu, &lim, &usage, w);
        let used = i64::from(usage.used_slices());
        for placement in &profile.placements {
            if !usage.fits(&lim, profile, *placement) {
                continue;
            }
            let mut after = usage.clone();
            after.add(profile, *placement);
            let loss = ((room_before - room(gpu, &lim, &after, w)) * 1000.0).round() as i64;
            let key = match variant {
                0 => (used == 0, loss, -used, 0),
                1 => (used == 0, -used, loss, 0),
                2 => (used == 0, loss - 1000 * used, 0, 0),
                3 => (used == 0, loss - 3000 * used, 0, 0),
                _ => (used == 0, loss + 1000 * used, 0, 0),
            };
            if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
                best = Some((key, g, (profile.id, placement.start)));
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
    let weight = |p: &crate::gpu::GiProfile| -> f64 {
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
        let traces: Vec<_> = (1..=5u64)
            .map(|seed| trace(10_000, seed, lifetime, &mix))
            .collect();
        let arrivals: usize = traces.iter().map(Vec::len).sum();
        let rate = |decide: &Decide| {
            let failed: usize = traces.iter().map(|t| simulate(&gpus, t, decide)).sum();
            100.0 * failed as f64 / arrivals as f64
        };
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
