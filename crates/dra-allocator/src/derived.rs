//! Derived attributes (DRADerivedAttributes, `derivedAttributes` of a request): attributes a
//! claim computes per device with CEL, which its constraints compare instead of the device's
//! own attribute of that name (`lookupAttribute` of the experimental allocator).
//!
//! Values are computed on first use, once per device and expression, and kept for the whole
//! `Allocate` call, as Go caches them; an error is reported where a constraint first looks.
use std::cell::OnceCell;

use dra_cel::{AttributeValue, CelError, Selector};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceDerivedAttribute, ResourceClaim};

use super::pools::NodePools;
use super::{Allocator, device_claim};

/// One distinct expression of the claims being allocated.
struct Expression {
    text: String,
    compiled: OnceCell<Result<Selector, CelError>>,
    /// Per candidate device of the node.
    values: Vec<OnceCell<Result<DeviceAttribute, String>>>,
}

/// The derived attributes' expressions of one `Allocate` call and their values per device.
pub(crate) struct DerivedValues {
    expressions: Vec<Expression>,
}

impl DerivedValues {
    /// Every expression the claims' requests and subrequests derive attributes with (none
    /// unless the feature is on: the allocator refuses such requests then).
    pub fn new(alloc: &Allocator, pools: &NodePools, claims: &[ResourceClaim]) -> Self {
        let mut expressions: Vec<Expression> = Vec::new();
        if !alloc.features().derived_attributes {
            return Self { expressions };
        }
        let requests = claims
            .iter()
            .filter_map(device_claim)
            .flat_map(|d| d.requests.iter().flatten());
        for request in requests {
            let exact = request
                .exactly
                .iter()
                .flat_map(|e| e.derived_attributes.iter().flatten());
            let subs = request
                .first_available
                .iter()
                .flatten()
                .flat_map(|s| s.derived_attributes.iter().flatten());
            for attribute in exact.chain(subs) {
                if !expressions.iter().any(|e| e.text == attribute.expression) {
                    expressions.push(Expression {
                        text: attribute.expression.clone(),
                        compiled: OnceCell::new(),
                        values: (0..pools.candidates.len())
                            .map(|_| OnceCell::new())
                            .collect(),
                    });
                }
            }
        }
        Self { expressions }
    }

    /// The request's derived attributes as (name, expression index).
    pub fn of<'r>(
        &self,
        attributes: Option<&'r Vec<DeviceDerivedAttribute>>,
    ) -> Vec<(&'r str, usize)> {
        attributes
            .into_iter()
            .flatten()
            .filter_map(|a| {
                let index = self
                    .expressions
                    .iter()
                    .position(|e| e.text == a.expression)?;
                Some((a.name.as_str(), index))
            })
            .collect()
    }

    /// The value of expression `expression` on candidate `index`, named `name` in errors as
    /// kube-scheduler names them.
    pub fn value<'s>(
        &'s self,
        alloc: &Allocator,
        pools: &NodePools,
        expression: usize,
        index: usize,
        name: &str,
    ) -> Result<&'s DeviceAttribute, String> {
        let e = &self.expressions[expression];
        let compiled = e.compiled.get_or_init(|| {
            let features = alloc.features();
            // The scheduler compiles them as stored expressions: lists are always allowed.
            dra_cel::compile_derived(
                &e.text,
                dra_cel::Features {
                    consumable_capacity: features.consumable_capacity,
                },
                true,
                features.list_type_attributes,
            )
        });
        let selector = match compiled {
            Ok(s) => s,
            Err(err) => return Err(format!("compile derived attribute {name} failed: {err}")),
        };
        let value = e.values[index].get_or_init(|| {
            let c = &pools.candidates[index];
            let view = alloc.view(c.slot, c.slice, c.device)?;
            selector
                .evaluate_attribute(view)
                .map(device_attribute)
                .map_err(|err| err.to_string())
        });
        value.as_ref().map_err(|err| {
            format!(
                "evaluate derived attribute {name} on device {} failed: {err}",
                pools.id(alloc, index)
            )
        })
    }
}

fn device_attribute(value: AttributeValue) -> DeviceAttribute {
    let mut a = DeviceAttribute::default();
    match value {
        AttributeValue::Bool(v) => a.bool = Some(v),
        AttributeValue::Int(v) => a.int = Some(v),
        AttributeValue::String(v) => a.string = Some(v),
        AttributeValue::Version(v) => a.version = Some(v),
        AttributeValue::Bools(v) => a.bools = Some(v),
        AttributeValue::Ints(v) => a.ints = Some(v),
        AttributeValue::Strings(v) => a.strings = Some(v),
        AttributeValue::Versions(v) => a.versions = Some(v),
    }
    a
}
