//! `gpu-dra capacity --replicas` of a workload of several pods (a JobSet, an MPIJob, a gang):
//! how many more copies of the whole workload the fleet admits, each copy's pods placed in
//! turn as `match --replicas` places them (first node, by name, that admits the pod and where its
//! claims fit), with claims of their own. A copy counts when all its pods fit, or, for a gang,
//! at least its minimum; the first that does not says which pod stopped it and why.
use std::collections::BTreeSet;

use dra_allocator::explain;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::super::CliError;
use super::super::claims::{Loaded, first_fit, fleet, usage};
use super::super::manifests::{Unit, allocation_of, claim_key};

/// The answer for a workload.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadCapacity {
    /// `JobSet ns/name`, `PodGroup ns/name`.
    pub workload: String,
    /// Its pods per copy, and how many of them must fit for a copy to count.
    pub pods: usize,
    pub needed: usize,
    /// More copies that fit.
    pub fits: usize,
    pub at_max: bool,
    /// What stops the next copy: its pod, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stops: Option<String>,
}

/// The pods of the first workload of the plan with a group of more than one pod.
pub fn group_units(loaded: &Loaded) -> Option<(String, Vec<&Unit>, usize)> {
    let first = loaded
        .plan
        .units
        .iter()
        .find_map(|u| u.group.as_ref().filter(|g| g.pods > 1))?;
    let units: Vec<&Unit> = loaded
        .plan
        .units
        .iter()
        .filter(|u| u.group.as_ref().is_some_and(|g| g.object == first.object))
        .collect();
    let needed = first
        .gang
        .as_ref()
        .map_or(units.len(), |g| {
            usize::try_from(g.min_count).unwrap_or(usize::MAX)
        })
        .min(units.len());
    Some((first.object.clone(), units, needed))
}

pub fn count(
    loaded: &Loaded,
    object: String,
    units: &[&Unit],
    needed: usize,
    max: usize,
) -> Result<WorkloadCapacity, CliError> {
    let generated: BTreeSet<String> = loaded.plan.generated.iter().map(claim_key).collect();
    let nodes = fleet(loaded);
    let mut state = loaded.state.clone();
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut fits = 0;
    let mut stops = None;
    while fits < max {
        let mut placed = 0;
        let mut first_stop = None;
        for unit in units {
            let claims: Vec<ResourceClaim> = unit
                .claims
                .iter()
                .filter(|c| allocation_of(c).is_none())
                .map(|c| super::copy_claim(c, &generated, fits))
                .filter(|c| !done.contains(&claim_key(c)))
                .collect();
            let admitted: Vec<_> = nodes
                .iter()
                .filter(|n| unit.placement.admits(n).is_ok())
                .filter(|n| {
                    unit.unserved
                        .iter()
                        .all(|(resource, _)| n.allocatable.contains_key(resource))
                })
                .collect();
            let outcome = first_fit(&loaded.allocator, &admitted, &claims, &state)
                .map(|(_, results)| results);
            let pod = unit.title.clone().unwrap_or_default();
            match outcome {
                Some(results) => {
                    for (claim, allocation) in claims.iter().zip(results) {
                        let key = claim_key(claim);
                        state
                            .mark(&key, &allocation, &loaded.features)
                            .map_err(usage)?;
                        done.insert(key);
                    }
                    placed += 1;
                }
                None if first_stop.is_none() => {
                    first_stop = Some(match admitted.first() {
                        None => format!("{pod}: no node admits it"),
                        Some(node) => {
                            let explanation =
                                explain::explain(&loaded.allocator, &node.info, &claims, &state);
                            format!(
                                "{pod}: {} (explained on node {})",
                                super::stopper(&explanation),
                                node.info.name
                            )
                        }
                    });
                }
                None => {}
            }
        }
        if placed < needed {
            // This copy is not admitted: what it placed is never used.
            stops = first_stop;
            break;
        }
        fits += 1;
        if units.iter().all(|u| {
            u.claims
                .iter()
                .all(|c| !generated.contains(&claim_key(c)) && allocation_of(c).is_none())
        }) && units.iter().all(|u| u.unserved.is_empty())
        {
            // Nothing a copy asks for is its own: every copy fits as the first did.
            fits = max;
            stops = Some("every copy shares the pods' named claims".into());
            break;
        }
    }
    Ok(WorkloadCapacity {
        workload: object,
        pods: units.len(),
        needed,
        fits,
        at_max: fits >= max,
        stops,
    })
}
