//! The checks on a device capacity's request policy (`validateRequestPolicyValidValues`,
//! `validateRequestPolicyRange`): its discrete options or its range, against the capacity.
use std::cmp::Ordering;
use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::super::convert::FieldError;
use super::super::validate::{ApiGates, at_most};

/// `CapacityRequestPolicyDiscreteMaxOptions`.
const MAX_VALID_VALUES: usize = 10;

/// `validateRequestPolicyValidValues`: at most 10 options, ascending, unique, none above the
/// capacity, the default among them.
pub(super) fn valid_values(
    capacity: &k8s_quantity::Quantity,
    default: &k8s_quantity::Quantity,
    values: &[Quantity],
    policy_at: &str,
    gates: ApiGates,
) -> Result<(), FieldError> {
    let at = field!(policy_at, "{policy_at}.validValues");
    at_most(Some(values), MAX_VALID_VALUES, &at)?;
    let parsed: Vec<k8s_quantity::Quantity> = values
        .iter()
        .filter_map(|q| k8s_quantity::Quantity::parse(&q.0).ok())
        .collect();
    for (i, pair) in parsed.windows(2).enumerate() {
        if pair[0].cmp_value(&pair[1]) == Ordering::Greater {
            return Err(FieldError::new(
                field!(at, "{at}[{}]", i + 1),
                format!(
                    "Invalid value: \"{}\": values must be sorted in ascending order",
                    pair[1]
                ),
            ));
        }
    }
    let mut keys = BTreeSet::new();
    for (i, option) in parsed.iter().enumerate() {
        if option.cmp_value(capacity) == Ordering::Greater {
            return Err(FieldError::new(
                field!(at, "{at}[{i}]"),
                format!(
                    "Invalid value: \"{option}\": option is larger than capacity value: {capacity}"
                ),
            ));
        }
        // Options are told apart as integers, or as decimals with fractional ranges on.
        let key = match option.value() {
            Some(v) if !gates.fractional_capacity_range => v.to_string(),
            _ => option.to_string(),
        };
        if !keys.insert(key) {
            return Err(FieldError::new(
                field!(at, "{at}[{i}]"),
                format!("Duplicate value: \"{option}\""),
            ));
        }
    }
    if !parsed
        .iter()
        .any(|o| o.cmp_value(default) == Ordering::Equal)
    {
        return Err(FieldError::new(
            at,
            format!(
                "Invalid value: \"{default}\": default value is not valid according to the requestPolicy"
            ),
        ));
    }
    Ok(())
}

/// `validateRequestPolicyRange`: min, max and default within the capacity and each other; a
/// positive step that fits once above min, with default and max whole steps from min, counted
/// in integers, or with DRAFractionalCapacityRange and a fractional value in thousandths.
pub(super) fn valid_range(
    capacity: &k8s_quantity::Quantity,
    default: &k8s_quantity::Quantity,
    range: &k8s_openapi::api::resource::v1::CapacityRequestPolicyRange,
    policy_at: &str,
    gates: ApiGates,
) -> Result<(), FieldError> {
    let at = field!(policy_at, "{policy_at}.validRange");
    let parse = |q: &Quantity| k8s_quantity::Quantity::parse(&q.0).ok();
    let invalid = |field: &str, value: &k8s_quantity::Quantity, message: String| {
        Err(FieldError::new(
            field!(at, "{at}.{field}"),
            format!("Invalid value: \"{value}\": {message}"),
        ))
    };
    let Some(min) = parse(&range.min) else {
        return Ok(());
    };
    if min.cmp_value(capacity) == Ordering::Greater {
        return invalid(
            "min",
            &min,
            format!("min is larger than capacity value: {capacity}"),
        );
    }
    if default.cmp_value(&min) == Ordering::Less {
        return invalid(
            "default",
            default,
            format!("default is less than min: {min}"),
        );
    }
    let max = range.max.as_ref().and_then(parse);
    if let Some(max) = &max {
        if min.cmp_value(max) == Ordering::Greater {
            return invalid("max", &min, format!("min is larger than max: {max}"));
        }
        if max.cmp_value(capacity) == Ordering::Greater {
            return invalid(
                "max",
                max,
                format!("max is larger than capacity value: {capacity}"),
            );
        }
        if default.cmp_value(max) == Ordering::Greater {
            return invalid(
                "default",
                default,
                format!("default is more than max: {max}"),
            );
        }
    }
    let step = range.step.as_ref().and_then(parse);
    // With DRAFractionalCapacityRange, a fractional value anywhere (the default included) puts
    // the range in thousandths, each value first checked to be a whole number of them.
    let use_milli = gates.fractional_capacity_range
        && [Some(&min), max.as_ref(), step.as_ref(), Some(default)]
            .into_iter()
            .flatten()
            .any(k8s_quantity::Quantity::is_fractional);
    let values = [
        (Some(default), "default"),
        (Some(&min), "min"),
        (max.as_ref(), "max"),
        (step.as_ref(), "step"),
    ];
    if use_milli {
        for (q, field) in values {
            if let Some(q) = q
                && q.exact_milli_value().is_none()
            {
                return invalid(
                    field,
                    q,
                    "value cannot be represented as a milli value".into(),
                );
            }
        }
    }
    let Some(step) = &step else {
        return Ok(());
    };
    if step.sign() <= 0 {
        return invalid("step", step, "must be greater than zero".into());
    }
    let one_step = min.add(step);
    if one_step.cmp_value(capacity) == Ordering::Greater {
        return invalid(
            "step",
            step,
            format!("one step {one_step} is larger than capacity value: {capacity}"),
        );
    }
    // Integer steps read each value rounded up to an integer, within [0, MaxInt64].
    if !use_milli {
        for (q, field) in values {
            let Some(q) = q else { continue };
            if q.sign() < 0 {
                return invalid(field, q, "must be greater than or equal to 0".into());
            }
            if q.value().is_none() {
                return invalid(
                    field,
                    q,
                    "must not be larger than 9223372036854775807".into(),
                );
            }
        }
    }
    let read = |q: &k8s_quantity::Quantity| {
        if use_milli {
            q.exact_milli_value()
        } else {
            q.value()
        }
    };
    let (Some(d), Some(m), Some(s)) = (read(default), read(&min), read(step)) else {
        return Ok(());
    };
    // Go's int64 arithmetic (the values were bounded above; the difference wraps as in Go).
    let multiple = |v: i64| v.wrapping_sub(m).wrapping_rem(s) == 0;
    if !multiple(d) {
        return invalid(
            "step",
            default,
            format!("value is not a multiple of a given step ({step}) from ({min})"),
        );
    }
    if let Some(max) = &max
        && let Some(x) = read(max)
        && !multiple(x)
    {
        return invalid(
            "step",
            max,
            format!("value is not a multiple of a given step ({step}) from ({min})"),
        );
    }
    Ok(())
}
