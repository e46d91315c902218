//! The API server's create-time checks on requests' `derivedAttributes` (k8s.io/kubernetes
//! v1.37 `validateDeviceDerivedAttribute`), applied where the DRADerivedAttributes gate is on:
//! names unique per request, each used by a `matchAttribute`/`distinctAttribute` constraint
//! that targets the request, expressions that compile as a derived attribute's (a new
//! expression: lists only with DRAListTypeAttributes), at most 32 per request, each within the
//! length and estimated cost limits of a selector and all of a claim's within that cost too.
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use dra_allocator::Features;
use k8s_openapi::api::resource::v1::{DeviceClaim, DeviceDerivedAttribute};

use super::{DeviceClaimRef, ManifestError, Manifests};

/// `DeviceDerivedAttributesMaxSize`.
const MAX_DERIVED_ATTRIBUTES: usize = 32;

/// Checks every claim's and template's derived attributes (nothing when the gate is off: the
/// scheduler then refuses such requests, naming the gate).
pub fn check(m: &Manifests, features: &Features) -> Result<(), ManifestError> {
    if !features.derived_attributes {
        return Ok(());
    }
    for claim in m.device_claims() {
        if let Some(devices) = claim.devices {
            check_claim(&claim, devices, features)?;
        }
    }
    Ok(())
}

fn check_claim(
    claim: &DeviceClaimRef<'_>,
    devices: &DeviceClaim,
    features: &Features,
) -> Result<(), ManifestError> {
    let fail = |field: String, message: String| claim.field_error(field, message);
    // Attributes the constraints compare, by the request they target ("" for all requests).
    let mut used: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for c in devices.constraints.iter().flatten() {
        let Some(attribute) = c
            .match_attribute
            .as_deref()
            .or(c.distinct_attribute.as_deref())
        else {
            continue;
        };
        match c.requests.as_deref() {
            None | Some([]) => {
                used.entry("").or_default().insert(attribute);
            }
            Some(requests) => {
                for r in requests {
                    used.entry(r.as_str()).or_default().insert(attribute);
                }
            }
        }
    }
    let is_used = |name: &str, request: &str| {
        let uses = |r: &str| used.get(r).is_some_and(|set| set.contains(name));
        uses("")
            || uses(request)
            || request
                .split_once('/')
                .is_some_and(|(parent, _)| uses(parent))
    };
    // The estimated cost of the claim's expressions, all together.
    let total_cost = Cell::new(0u64);
    let check = |attributes: Option<&Vec<DeviceDerivedAttribute>>, request: &str, path: String| {
        super::validate::at_most(
            attributes.map(Vec::as_slice),
            MAX_DERIVED_ATTRIBUTES,
            &format!("{path}.derivedAttributes"),
        )
        .map_err(|e| fail(e.field, e.message))?;
        let mut names = BTreeSet::new();
        for (k, attribute) in attributes.into_iter().flatten().enumerate() {
            let at = format!("{path}.derivedAttributes[{k}]");
            if !names.insert(attribute.name.as_str()) {
                return Err(fail(at, format!("Duplicate value: {:?}", attribute.name)));
            }
            if !attribute.name.is_empty() && !is_used(&attribute.name, request) {
                return Err(fail(
                    format!("{at}.name"),
                    format!(
                        "Invalid value: {:?}: must be referenced by at least one matchAttribute or distinctAttribute constraint targeting this request",
                        attribute.name
                    ),
                ));
            }
            if attribute.expression.is_empty() {
                continue;
            }
            let field = format!("{at}.expression");
            if attribute.expression.len() > dra_cel::MAX_EXPRESSION_LENGTH {
                return Err(fail(
                    field,
                    format!(
                        "Too long: may not be more than {} bytes",
                        dra_cel::MAX_EXPRESSION_LENGTH
                    ),
                ));
            }
            let cost = dra_cel::estimate_derived_cost_with(
                &attribute.expression,
                dra_cel::CostFeatures {
                    list_type_attributes: features.list_type_attributes,
                    consumable_capacity: features.consumable_capacity,
                },
            );
            match cost {
                Err(e) => {
                    let first = e.message().lines().next().unwrap_or("").to_string();
                    return Err(fail(
                        field,
                        format!("Invalid value: {:?}: {first}", attribute.expression),
                    ));
                }
                Ok(cost) if cost > dra_cel::MAX_COST => {
                    return Err(fail(
                        field,
                        "Forbidden: too complex, exceeds cost limit".to_string(),
                    ));
                }
                Ok(cost) => total_cost.set(total_cost.get().saturating_add(cost)),
            }
        }
        Ok(())
    };
    for (i, request) in devices.requests.iter().flatten().enumerate() {
        let path = format!("{}.requests[{i}]", claim.at);
        if let Some(exactly) = &request.exactly {
            check(
                exactly.derived_attributes.as_ref(),
                &request.name,
                format!("{path}.exactly"),
            )?;
        }
        for (j, sub) in request.first_available.iter().flatten().enumerate() {
            check(
                sub.derived_attributes.as_ref(),
                &format!("{}/{}", request.name, sub.name),
                format!("{path}.firstAvailable[{j}]"),
            )?;
        }
    }
    if total_cost.get() > dra_cel::MAX_COST {
        return Err(fail(
            claim.at.to_string(),
            "Forbidden: too complex, total cost of derived attribute CEL expressions in the claim exceeds cost limit".to_string(),
        ));
    }
    Ok(())
}
