//! The failures fragmentation leaves out: the trace replayed on a node whose live instances are
//! re-placed freely, on any of its GPUs, before every arrival. A request fails there only when
//! the live requests and it cannot be packed onto the node's GPUs at all (MIG's placement rules,
//! `fit_together`, per GPU): plain capacity, on the trajectory such a node would have.
//!
//! This is the limit a placement policy that never moves an instance can approach, not a
//! proven lower bound on its failures: accepting more earlier can cost more later, so on rare
//! traces a policy that fragments can fail fewer. The study compares it with the exact hindsight
//! optimum where that can be computed.
use std::collections::HashMap;

use super::packing_study::{Arrival, Wanted};
use gpu_dra::gpu::mig::fit_together;
use gpu_dra::gpu::{GiProfile, NodeInventory};

/// Most packing subproblems remembered before the replay gives up.
const MAX_MEMO: usize = 4_000_000;

/// Most instances of one profile a count vector holds (a byte).
const MAX_COUNT: usize = u8::MAX as usize;

/// Whether live profile instances fit on a number of identical GPUs, for count vectors over the
/// trace's profiles.
struct Packer {
    /// Every maximal set of instances one GPU holds, as counts per profile.
    configs: Vec<Vec<u8>>,
    /// Fewest GPUs a count vector needs.
    memo: HashMap<Vec<u8>, u8>,
}

impl Packer {
    fn new(profiles: &[GiProfile], used: &[&GiProfile]) -> Self {
        let mut configs = Vec::new();
        let mut counts = vec![0u8; used.len()];
        enumerate(profiles, used, 0, &mut counts, &mut configs);
        // Keep the maximal ones: a GPU never holds less than it could (fewer instances always
        // fit where more did).
        let maximal: Vec<Vec<u8>> = configs
            .iter()
            .filter(|c| {
                !configs
                    .iter()
                    .any(|d| d != *c && d.iter().zip(c.iter()).all(|(d, c)| d >= c))
            })
            .cloned()
            .collect();
        Self {
            configs: maximal,
            memo: HashMap::new(),
        }
    }

    /// Fewest GPUs that hold `counts`, or `None` once the memo is full.
    fn gpus_needed(&mut self, counts: &[u8]) -> Option<u8> {
        let Some(first) = counts.iter().position(|c| *c > 0) else {
            return Some(0);
        };
        if let Some(n) = self.memo.get(counts) {
            return Some(*n);
        }
        if self.memo.len() >= MAX_MEMO {
            return None;
        }
        // Some GPU holds an instance of the first profile present: try each maximal set with
        // one, filled from what is left.
        let mut best = u8::MAX;
        for c in 0..self.configs.len() {
            if self.configs[c][first] == 0 {
                continue;
            }
            let rest: Vec<u8> = counts
                .iter()
                .zip(&self.configs[c])
                .map(|(n, k)| n.saturating_sub(*k))
                .collect();
            best = best.min(self.gpus_needed(&rest)?.saturating_add(1));
        }
        self.memo.insert(counts.to_vec(), best);
        Some(best)
    }
}

/// Every set of instances of `used` profiles one GPU holds, as counts per profile.
fn enumerate(
    profiles: &[GiProfile],
    used: &[&GiProfile],
    at: usize,
    counts: &mut Vec<u8>,
    out: &mut Vec<Vec<u8>>,
) {
    if at == used.len() {
        out.push(counts.clone());
        return;
    }
    for n in 0..=used[at].instance_count.min(7) {
        counts[at] = n as u8;
        let ids: Vec<u32> = used
            .iter()
            .zip(counts.iter())
            .take(at + 1)
            .flat_map(|(p, k)| std::iter::repeat_n(p.id, usize::from(*k)))
            .collect();
        if !fit_together(profiles, &ids) {
            break;
        }
        enumerate(profiles, used, at + 1, counts, out);
    }
    counts[at] = 0;
}

/// Failures of the replay with free re-placement, or `None` when the node's MIG GPUs differ (the
/// packing assumes identical GPUs) or the packing memo outgrew its limit.
pub(super) fn fragmentation_free(base: &NodeInventory, arrivals: &[Arrival]) -> Option<usize> {
    let gpus: Vec<_> = base.gpus.iter().filter_map(|g| g.mig.as_ref()).collect();
    let first = gpus.first()?;
    if gpus.iter().any(|m| m.profiles != first.profiles) {
        return None;
    }
    let mut used: Vec<&GiProfile> = Vec::new();
    for arrival in arrivals {
        if let Wanted::Profile(name) = &arrival.wanted
            && !used.iter().any(|p| &p.name == name)
        {
            used.push(first.profiles.iter().find(|p| &p.name == name)?);
        }
    }
    let mut packer = Packer::new(&first.profiles, &used);
    let total = u8::try_from(gpus.len()).ok()?;
    // Live requests: when they leave and what they hold (`None`: a whole GPU).
    let mut live: Vec<(usize, Option<usize>)> = Vec::new();
    let mut counts = vec![0u8; used.len()];
    let mut whole = 0u8;
    let mut failed = 0;
    for (i, arrival) in arrivals.iter().enumerate() {
        live.retain(|(leaves_at, held)| {
            let stays = *leaves_at > i;
            if !stays {
                match held {
                    Some(p) => counts[*p] -= 1,
                    None => whole -= 1,
                }
            }
            stays
        });
        let held = match &arrival.wanted {
            Wanted::WholeGpu => {
                let fits = whole < total && packer.gpus_needed(&counts)? < total - whole;
                fits.then_some(None)
            }
            Wanted::Profile(name) => {
                let p = used.iter().position(|u| &u.name == name)?;
                if usize::from(counts[p]) >= MAX_COUNT {
                    return None;
                }
                counts[p] += 1;
                let fits = packer.gpus_needed(&counts)? <= total - whole;
                if fits {
                    Some(Some(p))
                } else {
                    counts[p] -= 1;
                    None
                }
            }
        };
        match held {
            Some(held) => {
                if held.is_none() {
                    whole += 1;
                }
                live.push((arrival.leaves_at, held));
            }
            None => failed += 1,
        }
    }
    Some(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_inventory as node;

    fn profile(name: &str, leaves_at: usize) -> Arrival {
        Arrival {
            wanted: Wanted::Profile(name.into()),
            leaves_at,
        }
    }

    #[test]
    fn seven_small_then_a_big_one_on_one_gpu() {
        let base = node("1xH100-SXM5-80GB");
        // Seven 1g fill the GPU; the 3g finds no room however they are placed.
        let mut arrivals: Vec<Arrival> = (0..7).map(|_| profile("1g.10gb", 100)).collect();
        arrivals.push(profile("3g.40gb", 100));
        assert_eq!(fragmentation_free(&base, &arrivals), Some(1));
    }

    #[test]
    fn departures_free_room_for_a_7g() {
        let base = node("1xH100-SXM5-80GB");
        // 3g + 4g fill the GPU: the 1g fails; both leave before the 7g, which fits.
        let arrivals = vec![
            profile("3g.40gb", 3),
            profile("4g.40gb", 3),
            profile("1g.10gb", 3),
            profile("7g.80gb", 10),
        ];
        assert_eq!(fragmentation_free(&base, &arrivals), Some(1));
    }

    #[test]
    fn across_gpus_and_whole_gpus() {
        let base = node("2xH100-SXM5-80GB");
        // A whole GPU takes one; two 4g cannot share the other.
        let arrivals = vec![
            Arrival {
                wanted: Wanted::WholeGpu,
                leaves_at: 100,
            },
            profile("4g.40gb", 100),
            profile("4g.40gb", 100),
            profile("3g.40gb", 100),
        ];
        assert_eq!(fragmentation_free(&base, &arrivals), Some(1));
    }

    #[test]
    fn the_maximal_sets_of_an_h100() {
        let base = node("1xH100-SXM5-80GB");
        let mig = base.gpus[0].mig.as_ref().expect("mig");
        let used: Vec<&GiProfile> = ["1g.10gb", "3g.40gb", "4g.40gb", "7g.80gb"]
            .iter()
            .map(|n| mig.profiles.iter().find(|p| &p.name == n).expect("profile"))
            .collect();
        let mut packer = Packer::new(&mig.profiles, &used);
        assert!(packer.configs.contains(&vec![7, 0, 0, 0]));
        assert!(packer.configs.contains(&vec![0, 1, 1, 0]));
        assert!(packer.configs.contains(&vec![0, 0, 0, 1]));
        assert_eq!(packer.gpus_needed(&[7, 2, 0, 1]), Some(3));
        assert_eq!(packer.gpus_needed(&[3, 1, 1, 0]), Some(2));
    }
}
