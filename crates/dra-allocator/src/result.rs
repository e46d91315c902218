//! The `status.allocation` of each claim: device results, configs from class and claim,
//! and the node selector.
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::AllocError;
use super::search::Run;

pub(crate) fn build(run: &Run<'_>) -> Result<Vec<AllocationResult>, AllocError> {
    let mut out = Vec::with_capacity(run.claims.len());
    for (ci, claim) in run.claims.iter().enumerate() {
        let mut results = Vec::new();
        for pick in &run.results[ci] {
            let req = &run.reqs[ci][pick.request][pick.sub];
            let id = run.id(pick.candidate);
            let device = run.device(pick.candidate);
            let binding = run.alloc.features.device_binding_and_status;
            results.push(DeviceRequestAllocationResult {
                request: req.full_name(),
                driver: id.driver.clone(),
                pool: id.pool.clone(),
                device: id.device.clone(),
                admin_access: req.admin.then_some(true),
                tolerations: Some(req.tolerations.clone()).filter(|t| !t.is_empty()),
                share_id: pick.share_id.clone(),
                consumed_capacity: pick.consumed.as_ref().map(|c| {
                    c.iter()
                        .map(|(name, amount)| (name.clone(), K8sQuantity(amount.text.clone())))
                        .collect()
                }),
                binding_conditions: if binding {
                    device.binding_conditions.clone()
                } else {
                    None
                },
                binding_failure_conditions: if binding {
                    device.binding_failure_conditions.clone()
                } else {
                    None
                },
                // The experimental allocator copies the slice's list (only devices whose
                // node may skip them get this far); incubating never sets it.
                skip_node_operations: if run.alloc.features.experimental() {
                    run.alloc.slices[run.candidate(pick.candidate).slice]
                        .spec
                        .skip_node_operations
                        .clone()
                        .filter(|s| !s.is_empty())
                } else {
                    None
                },
            });
        }
        let config = configs(run, ci);
        let node_selector = node_selector(run, ci).map_err(|e| {
            AllocError(format!(
                "create NodeSelector for claim {}: {e}",
                claim.metadata.name.as_deref().unwrap_or("")
            ))
        })?;
        out.push(AllocationResult {
            allocation_timestamp: None,
            devices: Some(DeviceAllocationResult {
                results: Some(results).filter(|r| !r.is_empty()),
                config: Some(config).filter(|c| !c.is_empty()),
            }),
            node_selector,
        });
    }
    Ok(out)
}

/// Name of the request, or `request/subrequest` for the subrequest that was picked.
fn chosen_name(run: &Run<'_>, claim: usize, request: usize) -> Option<String> {
    let entries = &run.reqs[claim][request];
    let first = entries.first()?;
    first.parent?;
    let chosen = &entries[run.selected_sub[claim][request]];
    Some(chosen.full_name())
}

/// Class configs once per class (in request order), then claim configs that apply to a
/// request or the chosen subrequest; configs covering every request get an empty list.
fn configs(run: &Run<'_>, ci: usize) -> Vec<DeviceAllocationConfiguration> {
    let claim = &run.claims[ci];
    let mut out: Vec<DeviceAllocationConfiguration> = Vec::new();
    let mut class_ranges: Vec<(&str, usize, usize)> = Vec::new();
    for (ri, entries) in run.reqs[ci].iter().enumerate() {
        let chosen = match entries.first() {
            Some(first) if first.parent.is_some() => &entries[run.selected_sub[ci][ri]],
            Some(first) => first,
            None => continue,
        };
        let Some(class) = chosen.class else {
            continue;
        };
        let class_name = class.metadata.name.as_deref().unwrap_or("");
        if let Some(&(_, start, end)) = class_ranges.iter().find(|(n, _, _)| *n == class_name) {
            for config in &mut out[start..end] {
                config
                    .requests
                    .get_or_insert_with(Vec::new)
                    .push(chosen.full_name());
            }
            continue;
        }
        let start = out.len();
        for config in class.spec.iter().flat_map(|s| s.config.iter().flatten()) {
            out.push(DeviceAllocationConfiguration {
                opaque: config.opaque.clone(),
                requests: Some(vec![chosen.full_name()]),
                source: "FromClass".to_string(),
            });
        }
        class_ranges.push((class_name, start, out.len()));
    }

    let requests = super::device_claim(claim)
        .and_then(|d| d.requests.as_deref())
        .unwrap_or(&[]);
    for config in super::device_claim(claim)
        .and_then(|d| d.config.as_deref())
        .unwrap_or(&[])
    {
        let wanted = config.requests.as_deref().unwrap_or(&[]);
        let from_claim = || DeviceAllocationConfiguration {
            opaque: config.opaque.clone(),
            requests: config.requests.clone().filter(|r| !r.is_empty()),
            source: "FromClaim".to_string(),
        };
        if wanted.is_empty() {
            out.push(from_claim());
            continue;
        }
        for (ri, request) in requests.iter().enumerate() {
            if wanted.contains(&request.name) {
                out.push(from_claim());
                break;
            }
            if let Some(sub) = chosen_name(run, ci, ri)
                && wanted.contains(&sub)
            {
                out.push(from_claim());
                break;
            }
        }
    }

    for config in &mut out {
        let Some(listed) = &config.requests else {
            continue;
        };
        if listed.is_empty() {
            continue;
        }
        let covers_all = requests.iter().enumerate().all(|(ri, request)| {
            listed.contains(&request.name)
                || chosen_name(run, ci, ri).is_some_and(|s| listed.contains(&s))
        });
        if covers_all {
            config.requests = None;
        }
    }
    out
}

/// `createNodeSelector`: a node-local device pins the claim to the node; otherwise the
/// slices' node selectors are merged into one term; devices available everywhere need none.
fn node_selector(run: &Run<'_>, ci: usize) -> Result<Option<NodeSelector>, String> {
    let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
    let mut expressions: Vec<NodeSelectorRequirement> = Vec::new();
    for pick in &run.results[ci] {
        let candidate = run.candidate(pick.candidate);
        let device = run.device(pick.candidate);
        let spec = &run.alloc.slices()[candidate.slice].spec;
        let (node_name, selector) = if spec.per_device_node_selection == Some(true) {
            (&device.node_name, &device.node_selector)
        } else {
            (&spec.node_name, &spec.node_selector)
        };
        if node_name.is_some() || device.binds_to_node == Some(true) {
            return Ok(Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".to_string(),
                        operator: "In".to_string(),
                        values: Some(vec![run.node.name.clone()]),
                    }]),
                }],
            }));
        }
        if let Some(selector) = selector {
            match selector.node_selector_terms.as_slice() {
                [] => {}
                [term] => {
                    add_new(term.match_fields.as_deref().unwrap_or(&[]), &mut fields);
                    add_new(
                        term.match_expressions.as_deref().unwrap_or(&[]),
                        &mut expressions,
                    );
                }
                terms => {
                    return Err(format!(
                        "unsupported ResourceSlice.NodeSelector with {} terms",
                        terms.len()
                    ));
                }
            }
        }
    }
    if fields.is_empty() && expressions.is_empty() {
        return Ok(None);
    }
    Ok(Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(expressions).filter(|e| !e.is_empty()),
            match_fields: Some(fields).filter(|f| !f.is_empty()),
        }],
    }))
}

fn add_new(from: &[NodeSelectorRequirement], to: &mut Vec<NodeSelectorRequirement>) {
    for requirement in from {
        let values: std::collections::BTreeSet<&String> =
            requirement.values.iter().flatten().collect();
        let present = to.iter().any(|r| {
            r.key == requirement.key
                && r.operator == requirement.operator
                && r.values
                    .iter()
                    .flatten()
                    .collect::<std::collections::BTreeSet<_>>()
                    == values
        });
        if !present {
            to.push(requirement.clone());
        }
    }
}
