//! Consumable capacity (`consumable_capacity.go`): what a request consumes of a device's
//! capacities under its request policy, and whether it still fits.
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceCapacity;
use num_bigint::BigInt;
use num_traits::{Signed, ToPrimitive, Zero};

use k8s_quantity::Quantity;

/// A quantity plus the text it is written as in results (Go marshals the canonical form).
#[derive(Debug, Clone)]
pub(crate) struct Amount {
    pub value: Quantity,
    pub text: String,
}

impl Amount {
    pub fn parse(text: &str) -> Result<Amount, String> {
        let value = Quantity::parse(text).map_err(|e| format!("{text:?}: {e}"))?;
        Ok(Amount {
            text: canonical_text_of(text, &value),
            value,
        })
    }

    fn from_scaled(value: i64, scale: i32, format: Format) -> Amount {
        let text = canonical(value, scale, format);
        let value = Quantity::parse(&text).unwrap_or_else(|_| Quantity::from_int(value));
        Amount { value, text }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    DecimalExponent,
    BinarySI,
    DecimalSI,
}

/// The suffix family a quantity was written in (Go keeps it as `Quantity.Format`).
pub(crate) fn format_of(text: &str) -> Format {
    let suffix = text
        .trim_start_matches(['+', '-'])
        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    match suffix {
        "" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => Format::DecimalSI,
        s if s.ends_with('i') => Format::BinarySI,
        _ => Format::DecimalExponent,
    }
}

/// Go's canonical text for an input when it is a plain int64-sized value; other inputs are
/// kept as written.
#[cfg(test)]
fn canonical_text(text: &str) -> String {
    match Quantity::parse(text) {
        Ok(q) => canonical_text_of(text, &q),
        Err(_) => text.to_string(),
    }
}

/// [`canonical_text`] of `text`, already parsed as `q`.
fn canonical_text_of(text: &str, q: &Quantity) -> String {
    let (mantissa, exp) = exact(q);
    match (mantissa.to_i64(), i32::try_from(exp)) {
        (Some(m), Ok(e)) if (-9..=18).contains(&e) => canonical(m, e, format_of(text)),
        _ => text.to_string(),
    }
}

/// `int64Amount{value, scale}` in Go's canonical `String()` form.
pub(crate) fn canonical(value: i64, scale: i32, format: Format) -> String {
    if value == 0 {
        return "0".to_string();
    }
    let mut format = format;
    if format == Format::BinarySI {
        let whole = if scale >= 0 {
            10i64
                .checked_pow(scale as u32)
                .and_then(|p| value.checked_mul(p))
        } else {
            let p = 10i64.checked_pow((-scale) as u32);
            p.filter(|p| value % p == 0).map(|p| value / p)
        };
        match whole {
            Some(v) if v <= -1024 || v >= 1024 => {
                let (mut amount, mut exp) = (v, 0);
                while amount % 1024 == 0 && exp < 6 {
                    amount /= 1024;
                    exp += 1;
                }
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp];
                return format!("{amount}{suffix}");
            }
            _ => format = Format::DecimalSI,
        }
    }
    let (mut amount, mut exp) = (value, scale);
    while amount % 10 == 0 {
        amount /= 10;
        exp += 1;
    }
    match exp.rem_euclid(3) {
        1 => {
            amount *= 10;
            exp -= 1;
        }
        2 => {
            amount *= 100;
            exp -= 2;
        }
        _ => {}
    }
    let suffix = match format {
        Format::DecimalExponent if exp == 0 => String::new(),
        Format::DecimalExponent => format!("e{exp}"),
        _ => match exp {
            -9 => "n".into(),
            -6 => "u".into(),
            -3 => "m".into(),
            0 => String::new(),
            3 => "k".into(),
            6 => "M".into(),
            9 => "G".into(),
            12 => "T".into(),
            15 => "P".into(),
            18 => "E".into(),
            other => format!("e{other}"),
        },
    };
    format!("{amount}{suffix}")
}

/// Exact value as mantissa × 10^exp (the quantity type prints itself that way).
fn exact(q: &Quantity) -> (BigInt, i64) {
    let text = q.to_string();
    let (m, e) = text.split_once('e').unwrap_or((text.as_str(), "0"));
    (
        m.parse().unwrap_or_else(|_| BigInt::zero()),
        e.parse().unwrap_or(0),
    )
}

/// Go's `ScaledValue(-shift)`: the value × 10^shift rounded away from zero; None past int64.
fn scaled_value(q: &Quantity, shift: i64) -> Option<i64> {
    let (m, e) = exact(q);
    let e = e + shift;
    let v = if e >= 0 {
        m * num_traits::pow(BigInt::from(10), usize::try_from(e).ok()?)
    } else {
        let d = num_traits::pow(BigInt::from(10), usize::try_from(-e).ok()?);
        let (quot, rem) = (&m / &d, &m % &d);
        if rem.is_zero() {
            quot
        } else if m.is_negative() {
            quot - 1
        } else {
            quot + 1
        }
    };
    v.to_i64()
}

fn value_of(q: &Quantity) -> Option<i64> {
    scaled_value(q, 0)
}

/// `safeMilliValue`: the milli value when it is exact.
fn safe_milli(q: &Quantity) -> Option<i64> {
    let milli = scaled_value(q, 3)?;
    let back = Quantity::parse(&format!("{milli}m")).ok()?;
    (back.cmp_value(q) == std::cmp::Ordering::Equal).then_some(milli)
}

const NOT_REPRESENTABLE: &str =
    "capacity request cannot be represented in the device's range arithmetic";

#[derive(Debug)]
pub(crate) struct Range {
    pub min: Option<Amount>,
    pub max: Option<Amount>,
    pub step: Option<Amount>,
}

#[derive(Debug)]
pub(crate) struct Policy {
    pub default: Option<Amount>,
    /// `Some` when the field is set, even empty (Go distinguishes nil).
    pub valid_values: Option<Vec<Amount>>,
    pub range: Option<Range>,
}

/// One capacity of a device, parsed.
#[derive(Debug)]
pub(crate) struct CapacityDef {
    pub name: String,
    pub value: Amount,
    pub policy: Option<Policy>,
}

pub(crate) fn parse_capacities(
    capacity: Option<&BTreeMap<String, DeviceCapacity>>,
) -> Result<Vec<CapacityDef>, String> {
    let mut out = Vec::new();
    for (name, cap) in capacity.into_iter().flatten() {
        let opt = |q: &Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
            q.as_ref().map(|q| Amount::parse(&q.0)).transpose()
        };
        let policy = match &cap.request_policy {
            None => None,
            Some(p) => Some(Policy {
                default: opt(&p.default)?,
                valid_values: p
                    .valid_values
                    .as_ref()
                    .map(|v| v.iter().map(|q| Amount::parse(&q.0)).collect())
                    .transpose()?,
                range: match &p.valid_range {
                    None => None,
                    Some(r) => Some(Range {
                        min: Some(Amount::parse(&r.min.0)?),
                        max: opt(&r.max)?,
                        step: opt(&r.step)?,
                    }),
                },
            }),
        };
        out.push(CapacityDef {
            name: name.clone(),
            value: Amount::parse(&cap.value.0)?,
            policy,
        });
    }
    Ok(out)
}

fn fill_empty_request(cap: &CapacityDef) -> Amount {
    match cap.policy.as_ref().and_then(|p| p.default.as_ref()) {
        Some(d) => d.clone(),
        None => cap.value.clone(),
    }
}

fn calculate_consumed(
    requested: Option<&Amount>,
    cap: &CapacityDef,
    fractional: bool,
) -> Result<Amount, String> {
    let Some(requested) = requested else {
        return Ok(fill_empty_request(cap));
    };
    let Some(policy) = &cap.policy else {
        return Ok(requested.clone());
    };
    if let Some(range) = policy.range.as_ref().filter(|r| r.min.is_some()) {
        return round_up_range(requested, range, fractional);
    }
    if let Some(values) = &policy.valid_values {
        let fit = values
            .iter()
            .find(|v| requested.value.cmp_value(&v.value).is_le());
        return Ok(fit.unwrap_or(requested).clone());
    }
    Ok(requested.clone())
}

fn use_milli(range: &Range, fractional: bool) -> bool {
    if !fractional {
        return false;
    }
    for q in [&range.min, &range.max].into_iter().flatten() {
        if safe_milli(&q.value).is_none() {
            return false;
        }
    }
    match &range.step {
        Some(step) => safe_milli(&step.value).is_some_and(|m| m >= 1),
        None => true,
    }
}

fn round_up_range(requested: &Amount, range: &Range, fractional: bool) -> Result<Amount, String> {
    let Some(min) = &range.min else {
        return Ok(requested.clone());
    };
    if requested.value.cmp_value(&min.value).is_lt() {
        return Ok(min.clone());
    }
    let Some(step) = &range.step else {
        return Ok(requested.clone());
    };
    let format = format_of(&step.text);
    if use_milli(range, fractional) {
        let req = safe_milli(&requested.value).ok_or_else(|| {
            format!(
                "{NOT_REPRESENTABLE}: request {} is not a representable milli value",
                requested.text
            )
        })?;
        let (step_m, min_m) = (
            scaled_value(&step.value, 3).unwrap_or(1).max(1),
            scaled_value(&min.value, 3).unwrap_or(0),
        );
        let added = req - min_m;
        let mut n = added / step_m;
        if added % step_m != 0 {
            n += 1;
        }
        if n > (i64::MAX - min_m) / step_m {
            return Err(format!(
                "{NOT_REPRESENTABLE}: rounding request {} up to the next step passes the milli-value range",
                requested.text
            ));
        }
        let v = min_m + step_m * n;
        return Ok(if v % 1000 == 0 {
            Amount::from_scaled(v / 1000, 0, format)
        } else {
            Amount::from_scaled(v, -3, format)
        });
    }
    let req = value_of(&requested.value).ok_or_else(|| {
        format!(
            "{NOT_REPRESENTABLE}: request {} exceeds MaxInt64",
            requested.text
        )
    })?;
    let step_v = value_of(&step.value).unwrap_or(0);
    let min_v = value_of(&min.value).unwrap_or(0);
    if step_v == 0 {
        // Go would divide by zero; validation keeps step positive.
        return Err(format!("{NOT_REPRESENTABLE}: step {} is zero", step.text));
    }
    let added = req - min_v;
    let mut n = added / step_v;
    if added % step_v != 0 {
        n += 1;
    }
    if min_v >= 0 && n > (i64::MAX - min_v) / step_v {
        return Err(format!(
            "{NOT_REPRESENTABLE}: rounding request {} up to the next step passes MaxInt64",
            requested.text
        ));
    }
    Ok(Amount::from_scaled(min_v + step_v * n, 0, format))
}

fn violates_policy(consumed: &Amount, policy: Option<&Policy>, fractional: bool) -> bool {
    let Some(policy) = policy else {
        return false;
    };
    // Go compares the Quantity structs; identical text is the same parsed struct.
    if let Some(d) = &policy.default
        && d.text == consumed.text
        && d.value == consumed.value
    {
        return false;
    }
    if let Some(range) = &policy.range {
        if let Some(max) = &range.max
            && consumed.value.cmp_value(&max.value).is_gt()
        {
            return true;
        }
        if let Some(step) = &range.step {
            let zero = || Some(0);
            let (req, step_v, min_v) = if use_milli(range, fractional) {
                let Some(req) = safe_milli(&consumed.value) else {
                    return true;
                };
                (
                    Some(req),
                    scaled_value(&step.value, 3),
                    range
                        .min
                        .as_ref()
                        .map_or_else(zero, |m| scaled_value(&m.value, 3)),
                )
            } else {
                (
                    value_of(&consumed.value),
                    value_of(&step.value),
                    range.min.as_ref().map_or_else(zero, |m| value_of(&m.value)),
                )
            };
            return match (req, step_v, min_v) {
                (Some(r), Some(s), Some(m)) if s != 0 => (r - m) % s != 0,
                _ => true,
            };
        }
        return false;
    }
    match &policy.valid_values {
        Some(values) if !values.is_empty() => !values
            .iter()
            .any(|v| v.value.cmp_value(&consumed.value).is_eq()),
        _ => false,
    }
}

/// Capacity taken so far from a device, by capacity name.
pub(crate) type Consumed = BTreeMap<String, Quantity>;

/// `CmpRequestOverCapacity`: whether the request fits what is left of the device's
/// capacities. `Err` aborts the allocation (unrepresentable or negative amounts).
pub(crate) fn request_fits(
    current: Option<&Consumed>,
    requests: Option<&[(String, Amount)]>,
    caps: &[CapacityDef],
    allocating: Option<&Consumed>,
    fractional: bool,
) -> Result<bool, String> {
    let requests = requests.unwrap_or(&[]);
    if requests
        .iter()
        .any(|(name, _)| !caps.iter().any(|c| &c.name == name))
    {
        return Ok(false);
    }
    let mut consumed = Vec::with_capacity(caps.len());
    for cap in caps {
        let requested = requests
            .iter()
            .find(|(n, _)| n == &cap.name)
            .map(|(_, a)| a);
        let amount = calculate_consumed(requested, cap, fractional)
            .map_err(|e| format!("capacity {:?}: {e}", cap.name))?;
        if amount.value.sign() < 0 {
            return Err(format!(
                "capacity {:?}: capacity value is negative",
                cap.name
            ));
        }
        consumed.push(amount);
    }
    for (cap, amount) in caps.iter().zip(&consumed) {
        if violates_policy(amount, cap.policy.as_ref(), fractional) {
            return Ok(false);
        }
        let mut total = amount.value.clone();
        if let Some(prev) = current.and_then(|c| c.get(&cap.name)) {
            total = prev.add(&total);
        }
        if let Some(more) = allocating.and_then(|c| c.get(&cap.name)) {
            total = total.add(more);
        }
        if total.cmp_value(&cap.value.value).is_gt() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `GetConsumedCapacityFromRequest`: what a share takes of every capacity of the device.
pub(crate) fn consumed_by_request(
    requests: Option<&[(String, Amount)]>,
    caps: &[CapacityDef],
    fractional: bool,
) -> Result<Vec<(String, Amount)>, String> {
    let requests = requests.unwrap_or(&[]);
    caps.iter()
        .map(|cap| {
            let requested = requests
                .iter()
                .find(|(n, _)| n == &cap.name)
                .map(|(_, a)| a);
            calculate_consumed(requested, cap, fractional)
                .map(|a| (cap.name.clone(), a))
                .map_err(|e| format!("capacity {:?}: {e}", cap.name))
        })
        .collect()
}

/// Whether the fast path applies: nothing requested, no policies, nothing consumed yet
/// (then every capacity trivially fits itself).
pub(crate) fn trivially_fits(
    requests: Option<&[(String, Amount)]>,
    caps: &[CapacityDef],
    current: Option<&Consumed>,
    allocating: Option<&Consumed>,
) -> bool {
    requests.is_none_or(|r| r.is_empty())
        && current.is_none()
        && allocating.is_none()
        && caps
            .iter()
            .all(|c| c.policy.is_none() && c.value.value.sign() >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms_match_go() {
        assert_eq!(canonical(1, 0, Format::DecimalSI), "1");
        assert_eq!(canonical(1000, 0, Format::DecimalSI), "1k");
        assert_eq!(canonical(1500, 0, Format::DecimalSI), "1500");
        assert_eq!(canonical(1500, -3, Format::DecimalSI), "1500m");
        assert_eq!(canonical(750, -3, Format::DecimalSI), "750m");
        assert_eq!(canonical(1 << 30, 0, Format::BinarySI), "1Gi");
        assert_eq!(canonical(1536 << 20, 0, Format::BinarySI), "1536Mi");
        assert_eq!(canonical(100, 0, Format::BinarySI), "100");
        assert_eq!(canonical(2000, 0, Format::DecimalExponent), "2e3");
        assert_eq!(canonical_text("1024Mi"), "1Gi");
        assert_eq!(canonical_text("40Gi"), "40Gi");
    }

    #[test]
    fn scaled_values_round_away_from_zero() {
        let q = |s: &str| Quantity::parse(s).unwrap();
        assert_eq!(value_of(&q("600m")), Some(1));
        assert_eq!(value_of(&q("2")), Some(2));
        assert_eq!(scaled_value(&q("1.5"), 3), Some(1500));
        assert_eq!(safe_milli(&q("0.0005")), None);
        assert_eq!(format_of("1Gi"), Format::BinarySI);
        assert_eq!(format_of("1E"), Format::DecimalSI);
        assert_eq!(format_of("1e3"), Format::DecimalExponent);
    }

    fn cap(value: &str, default: &str, min: &str, step: &str) -> CapacityDef {
        CapacityDef {
            name: "cores".into(),
            value: Amount::parse(value).unwrap(),
            policy: Some(Policy {
                default: Some(Amount::parse(default).unwrap()),
                valid_values: None,
                range: Some(Range {
                    min: Some(Amount::parse(min).unwrap()),
                    max: None,
                    step: Some(Amount::parse(step).unwrap()),
                }),
            }),
        }
    }

    #[test]
    fn ranges_round_up_in_integers_without_fractional_gate() {
        let c = cap("4", "1", "500m", "250m");
        let req = Amount::parse("600m").unwrap();
        assert_eq!(calculate_consumed(Some(&req), &c, false).unwrap().text, "1");
        assert_eq!(
            calculate_consumed(Some(&req), &c, true).unwrap().text,
            "750m"
        );
        let caps = [c];
        let reqs = [("cores".to_string(), Amount::parse("5").unwrap())];
        assert_eq!(
            request_fits(None, Some(&reqs), &caps, None, false),
            Ok(false)
        );
    }
}
