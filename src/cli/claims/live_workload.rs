//! `gpu-dra explain job/NAME` (and the other workloads `live::workload` reads) on a live
//! cluster: Kueue's verdict, or the workload's pending pods placed in turn on the cluster's
//! nodes as the scheduler would place them (the first node, by name, that admits the pod and
//! holds all its claims), each with the devices the ones before it took. A pod that fits says
//! where; the first that does not is explained on the first node that admits it.
use std::collections::{HashMap, HashSet};
use std::process::ExitCode;

use dra_allocator::explain;

use super::{
    ExplainArgs, PARTIAL, admitting, first_fit, fleet, load_with, never_fits, not_admitted,
    pending, usage,
};
use crate::cli::CliError;
use crate::cli::live::workload::{Reading, WorkloadKind, read};
use crate::cli::manifests::claim_key;

pub(super) fn explain(
    args: &ExplainArgs,
    kind: &WorkloadKind,
    name: &str,
) -> Result<ExitCode, CliError> {
    let (lines, snapshot) = match read(args.kubeconfig.as_deref(), &args.namespace, kind, name)? {
        Reading::Settled { lines, stopped } => {
            for line in lines {
                println!("{line}");
            }
            return Ok(if stopped {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            });
        }
        Reading::Pending { lines, snapshot } => (lines, snapshot),
    };
    for line in lines {
        println!("{line}");
    }
    let mut inputs = args.inputs.clone();
    inputs.claim = None;
    let loaded = load_with(&inputs, Some(snapshot))?;
    let nodes = fleet(&loaded);
    let mut state = loaded.state.clone();
    let mut done = HashSet::new();
    // Where each claim placed here went: a pod sharing it must go there too.
    let mut claim_node: HashMap<String, String> = HashMap::new();
    let (mut placed, mut stuck) = (0, 0);
    for unit in &loaded.plan.units {
        let title = unit
            .title
            .as_deref()
            .unwrap_or("ResourceClaims no pod uses");
        println!();
        if !unit.unserved.is_empty() {
            let names: Vec<&str> = unit.unserved.iter().map(|(r, _)| r.as_str()).collect();
            println!(
                "{title}: asks {} besides its claims: no DeviceClass backs it, so only a node whose device plugin serves it takes the pod",
                names.join(", ")
            );
        }
        let claims = pending(unit, &done);
        let (bound, admitted) = admitting(&nodes, unit, &claim_node);
        match first_fit(&loaded.allocator, &admitted, &claims, &state) {
            Some((node, results)) => {
                let mut devices = Vec::new();
                for (claim, allocation) in claims.iter().zip(&results) {
                    let key = claim_key(claim);
                    state
                        .mark(&key, allocation, &loaded.features)
                        .map_err(usage)?;
                    devices.extend(
                        allocation
                            .devices
                            .as_ref()
                            .map(|d| {
                                d.results
                                    .iter()
                                    .flatten()
                                    .map(|r| r.device.clone())
                                    .collect()
                            })
                            .unwrap_or_else(Vec::new),
                    );
                    claim_node.insert(key.clone(), node.clone());
                    done.insert(key);
                }
                placed += 1;
                println!(
                    "{title}: fits on node {node}{}",
                    if devices.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", devices.join(", "))
                    }
                );
            }
            None => {
                stuck += 1;
                let Some(first) = admitted.first() else {
                    println!("{title}: no node admits the pod, before any device is looked at:");
                    for line in not_admitted(&nodes, unit, bound) {
                        println!("{line}");
                    }
                    continue;
                };
                println!(
                    "{title}: cannot be allocated on any of the {} nodes ({} admit the pod); explained on node {}:",
                    nodes.len(),
                    admitted.len(),
                    first.info.name
                );
                let explanation = explain::explain(&loaded.allocator, &first.info, &claims, &state);
                for line in never_fits(&loaded.plan, &explanation, &claims) {
                    println!("{line}");
                }
                print!("{}", explanation.render());
            }
        }
    }
    Ok(match (placed, stuck) {
        (_, 0) => ExitCode::SUCCESS,
        (0, _) => ExitCode::from(1),
        _ => ExitCode::from(PARTIAL),
    })
}
