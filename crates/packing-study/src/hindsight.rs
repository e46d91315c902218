//! The fewest failed placements any placement policy could have had on a trace, knowing the
//! future but never moving a live instance: exact dynamic programming over the node's states,
//! for small nodes and traces (the states multiply with GPUs and live instances).
use std::collections::HashMap;

use super::packing_study::{Arrival, Wanted};
use gpu_dra::gpu::{GiProfile, Gpu, NodeInventory, Placement};
use gpu_dra::slices::packing::{Usage, limits};

/// One live request in a state: when it leaves, which GPU, what it holds (`None`: the whole
/// GPU).
type Live = (usize, u32, Held);

/// What a live request holds: a profile id at a placement, or (`None`) the whole GPU.
type Held = Option<(u32, Placement)>;

/// The optimum's failures, or `None` when the states outgrew `max_states` at some step.
pub(super) fn optimum(
    base: &NodeInventory,
    arrivals: &[Arrival],
    max_states: usize,
) -> Option<usize> {
    let gpus: Vec<&Gpu> = base.gpus.iter().filter(|g| g.mig.is_some()).collect();
    // Identical GPUs are interchangeable: states that differ only in which GPU holds what are one.
    let interchangeable = gpus
        .windows(2)
        .all(|w| w[0].product_name == w[1].product_name);
    let mut states: HashMap<Vec<Live>, usize> = HashMap::from([(Vec::new(), 0)]);
    for (i, Arrival { wanted, leaves_at }) in arrivals.iter().enumerate() {
        let mut next: HashMap<Vec<Live>, usize> = HashMap::with_capacity(states.len() * 2);
        let minors: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
        let keep = |next: &mut HashMap<Vec<Live>, usize>, state: Vec<Live>, failed: usize| {
            let state = if interchangeable {
                canonical(state, &minors)
            } else {
                state
            };
            let slot = next.entry(state).or_insert(usize::MAX);
            *slot = (*slot).min(failed);
        };
        for (state, failed) in states {
            let live: Vec<Live> = state.into_iter().filter(|l| l.0 > i).collect();
            let mut placed = false;
            for gpu in &gpus {
                let on_gpu: Vec<&Live> = live.iter().filter(|l| l.1 == gpu.minor).collect();
                if on_gpu.iter().any(|l| l.2.is_none()) {
                    continue;
                }
                match wanted {
                    Wanted::WholeGpu => {
                        if on_gpu.is_empty() {
                            let mut after = live.clone();
                            after.push((*leaves_at, gpu.minor, None));
                            after.sort_unstable();
                            keep(&mut next, after, failed);
                            placed = true;
                        }
                    }
                    Wanted::Profile(name) => {
                        let Some(mig) = gpu.mig.as_ref() else {
                            continue;
                        };
                        let Some(profile) = mig.profiles.iter().find(|p| &p.name == name) else {
                            continue;
                        };
                        let usage = usage_of(mig.profiles.as_slice(), &on_gpu);
                        let limits = limits(gpu);
                        for placement in fitting(&usage, &limits, profile) {
                            let mut after = live.clone();
                            after.push((*leaves_at, gpu.minor, Some((profile.id, placement))));
                            after.sort_unstable();
                            keep(&mut next, after, failed);
                            placed = true;
                        }
                    }
                }
            }
            if !placed {
                keep(&mut next, live, failed + 1);
            }
            if next.len() > max_states {
                return None;
            }
        }
        states = next;
    }
    states.into_values().min()
}

/// The state with GPUs renumbered by their content (sorted), so that GPU order does not matter.
fn canonical(state: Vec<Live>, minors: &[u32]) -> Vec<Live> {
    let mut groups: Vec<Vec<(usize, Held)>> = minors
        .iter()
        .map(|m| {
            state
                .iter()
                .filter(|l| l.1 == *m)
                .map(|l| (l.0, l.2))
                .collect()
        })
        .collect();
    groups.sort_unstable();
    let mut out: Vec<Live> = groups
        .into_iter()
        .zip(minors)
        .flat_map(|(group, minor)| group.into_iter().map(move |(t, held)| (t, *minor, held)))
        .collect();
    out.sort_unstable();
    out
}

fn usage_of(profiles: &[GiProfile], live: &[&Live]) -> Usage {
    let mut usage = Usage::default();
    for (_, _, held) in live {
        if let Some((id, placement)) = held
            && let Some(profile) = profiles.iter().find(|p| p.id == *id)
        {
            usage.add(profile, *placement);
        }
    }
    usage
}

/// The placements of `profile` that fit beside `usage`.
pub(super) fn fitting<'a>(
    usage: &'a Usage,
    limits: &'a [u64; 7],
    profile: &'a GiProfile,
) -> impl Iterator<Item = Placement> + 'a {
    profile
        .placements
        .iter()
        .copied()
        .filter(move |p| usage.fits(limits, profile, *p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_dra::gpu::sim::SimNode;

    fn profile(name: &str, leaves_at: usize) -> Arrival {
        Arrival {
            wanted: Wanted::Profile(name.into()),
            leaves_at,
        }
    }

    fn whole(leaves_at: usize) -> Arrival {
        Arrival {
            wanted: Wanted::WholeGpu,
            leaves_at,
        }
    }

    fn h100s(n: u32) -> NodeInventory {
        SimNode::new(
            format!("{n}xH100-SXM5-80GB").parse().expect("spec"),
            "n",
            None,
        )
        .inventory()
        .expect("inventory")
    }

    #[test]
    fn knowing_the_future_places_small_slices_where_the_big_one_still_fits() {
        let node = h100s(1);
        // A 1g.10gb that stays, then a 3g.40gb and a 4g.40gb: 4g.40gb needs slots 0–3 and the
        // 3g.40gb then 4–7, so wherever the 1g goes, one of the big two fails.
        let trace = [
            profile("1g.10gb", 10),
            profile("3g.40gb", 10),
            profile("4g.40gb", 10),
        ];
        assert_eq!(optimum(&node, &trace, 1000), Some(1));
        // Without the 1g, both big ones fit.
        let trace = [profile("3g.40gb", 10), profile("4g.40gb", 10)];
        assert_eq!(optimum(&node, &trace, 1000), Some(0));
        // Two 2g.20gb, then a 3g.40gb: the 2g's at 0 and 2 leave 4–7 for it (at 2 and 4
        // nothing would be left).
        let trace = [
            profile("2g.20gb", 10),
            profile("2g.20gb", 10),
            profile("3g.40gb", 10),
        ];
        assert_eq!(optimum(&node, &trace, 1000), Some(0));
    }

    #[test]
    fn departures_free_room_and_whole_gpus_need_an_empty_gpu() {
        let node = h100s(2);
        let trace = [
            profile("1g.10gb", 2),
            whole(5),
            // The 1g left at event 2: the other GPU is empty again.
            whole(5),
            whole(5),
        ];
        assert_eq!(optimum(&node, &trace, 1000), Some(1));
    }

    #[test]
    fn gives_up_beyond_the_state_limit() {
        let node = h100s(1);
        let trace: Vec<_> = (0..9).map(|i| profile("1g.10gb", i + 8)).collect();
        // Every order of seven 1g.10gb in seven slots is a state of its own (they leave at
        // different times): 5,040 at the seventh arrival.
        assert_eq!(optimum(&node, &trace, 3), None);
        // Seven places; the eighth arrival comes before the first departure.
        assert_eq!(optimum(&node, &trace, 10_000), Some(1));
    }
}
