//! Kubernetes `resource.Quantity` (apimachinery `pkg/api/resource`), reproduced exactly.
//!
//! A quantity keeps the same internal representation Go uses, because some CEL results depend
//! on it, not only on the numeric value: `isInteger()`/`asInteger()` are false for any value
//! held as an `inf.Dec` or with a negative int64 scale (`quantity("1.0").isInteger()` is
//! false), and `asApproximateFloat()` multiplies the stored mantissa by a power of ten.
//! Comparisons and equality are exact and numeric.
//!
//! A crate of its own because the node agent needs it too (opaque configs carry memory limits as
//! quantities) while it must not link the CEL engine that is the other user.
use std::cmp::Ordering;
use std::fmt;

use num_bigint::{BigInt, Sign};
use num_traits::{Signed, ToPrimitive, Zero};

/// The regular expression Kubernetes quotes when a quantity is malformed.
const FORMAT_WRONG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{FORMAT_WRONG}")]
    FormatWrong,
    #[error("unable to parse numeric part of quantity")]
    Numeric,
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// How the value is stored, mirroring Go's `int64Amount` / `infDecAmount` split.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Amount {
    /// `value × 10^scale` (Go `int64Amount`).
    Int64 { value: i64, scale: i32 },
    /// `unscaled × 10^-scale` (Go `inf.Dec`).
    Dec { unscaled: BigInt, scale: i32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    DecimalExponent,
    BinarySI,
    DecimalSI,
}

/// A parsed Kubernetes quantity.
#[derive(Debug, Clone)]
pub struct Quantity {
    amount: Amount,
    /// True for results of `add`/`sub`: Go returns those as `*Quantity`, and
    /// `Quantity.Equal` only accepts a non-pointer right-hand side, so
    /// `quantity("2") == quantity("1").add(1)` is a "no such overload" error.
    from_arithmetic: bool,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.cmp_value(other) == Ordering::Equal
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (mantissa, exp10) = self.mantissa_exp10();
        write!(f, "{mantissa}e{exp10}")
    }
}

fn pow10(exp: u32) -> BigInt {
    num_traits::pow(BigInt::from(10u32), exp as usize)
}

/// Go's `math.Pow10`, which is not `10f64.powi` (different rounding for large exponents).
fn go_pow10(n: i64) -> f64 {
    const TAB: [f64; 32] = [
        1e00, 1e01, 1e02, 1e03, 1e04, 1e05, 1e06, 1e07, 1e08, 1e09, 1e10, 1e11, 1e12, 1e13, 1e14,
        1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27, 1e28, 1e29,
        1e30, 1e31,
    ];
    const POS32: [f64; 10] = [
        1e00, 1e32, 1e64, 1e96, 1e128, 1e160, 1e192, 1e224, 1e256, 1e288,
    ];
    const NEG32: [f64; 11] = [
        1e-00, 1e-32, 1e-64, 1e-96, 1e-128, 1e-160, 1e-192, 1e-224, 1e-256, 1e-288, 1e-320,
    ];
    if (0..=308).contains(&n) {
        let n = n as usize;
        return POS32[n / 32] * TAB[n % 32];
    }
    if (-323..=0).contains(&n) {
        let n = (-n) as usize;
        return NEG32[n / 32] / TAB[n % 32];
    }
    if n > 0 { f64::INFINITY } else { 0.0 }
}

/// Go's `int64Multiply`.
fn int64_multiply(a: i64, b: i64) -> Option<i64> {
    if a == 0 || b == 0 || a == 1 || b == 1 {
        return Some(a.wrapping_mul(b));
    }
    if a == i64::MIN || b == i64::MIN {
        return None;
    }
    a.checked_mul(b)
}

/// Go's `positiveScaleInt64`: `base × 10^scale` or None on overflow.
fn positive_scale_int64(base: i64, scale: i32) -> Option<i64> {
    let mut value = base;
    for _ in 0..scale {
        if value == 0 || value == 1 {
            value = value.wrapping_mul(10);
            continue;
        }
        if value == i64::MIN {
            return None;
        }
        value = value.checked_mul(10)?;
    }
    Some(value)
}

struct Parts<'a> {
    positive: bool,
    value: &'a str,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

/// Go's `parseQuantityString`.
/// `a` then `b`, read as one decimal integer (both digits only, not both empty), as
/// `format!("{a}{b}").parse::<i64>()` reads it.
fn digits_value(a: &str, b: &str) -> Option<i64> {
    if a.is_empty() && b.is_empty() {
        return None;
    }
    a.bytes().chain(b.bytes()).try_fold(0i64, |acc, digit| {
        if !digit.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(i64::from(digit - b'0'))
    })
}

fn split_quantity(s: &str) -> Result<Parts<'_>, QuantityError> {
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut positive = true;
    if pos < end {
        match b[0] {
            b'-' => {
                positive = false;
                pos += 1;
            }
            b'+' => pos += 1,
            _ => {}
        }
    }
    // Strip leading zeros; an all-zero input is "0".
    loop {
        if pos >= end {
            return Ok(Parts {
                positive,
                value: "0",
                num: "0",
                denom: "",
                suffix: "",
            });
        }
        if b[pos] == b'0' {
            pos += 1;
        } else {
            break;
        }
    }
    let num_start = pos;
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos >= end {
        return Ok(Parts {
            positive,
            value: s,
            num: &s[num_start..],
            denom: "",
            suffix: "",
        });
    }
    let num = if pos == num_start {
        "0"
    } else {
        &s[num_start..pos]
    };
    let mut denom = "";
    if b[pos] == b'.' {
        pos += 1;
        let denom_start = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        if pos >= end {
            return Ok(Parts {
                positive,
                value: s,
                num,
                denom: &s[denom_start..],
                suffix: "",
            });
        }
        denom = &s[denom_start..pos];
    }
    let value = &s[..pos];
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos >= end {
        return Ok(Parts {
            positive,
            value,
            num,
            denom,
            suffix: &s[suffix_start..],
        });
    }
    if b[pos] == b'-' || b[pos] == b'+' {
        pos += 1;
    }
    while pos < end {
        if !b[pos].is_ascii_digit() {
            return Err(QuantityError::FormatWrong);
        }
        pos += 1;
    }
    Ok(Parts {
        positive,
        value,
        num,
        denom,
        suffix: &s[suffix_start..],
    })
}

/// Go's `suffixHandler.interpret`: (base, exponent, format).
fn interpret_suffix(suffix: &str) -> Option<(u32, i32, Format)> {
    let dec = match suffix {
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "" => Some(0),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(exp) = dec {
        return Some((10, exp, Format::DecimalSI));
    }
    let bin = match suffix {
        "Ki" => Some(10),
        "Mi" => Some(20),
        "Gi" => Some(30),
        "Ti" => Some(40),
        "Pi" => Some(50),
        "Ei" => Some(60),
        _ => None,
    };
    if let Some(exp) = bin {
        return Some((2, exp, Format::BinarySI));
    }
    let first = suffix.as_bytes().first()?;
    if suffix.len() > 1 && (*first == b'e' || *first == b'E') {
        let parsed = go_parse_int(&suffix[1..])?;
        // Go truncates the parsed int64 to int32.
        return Some((10, parsed as i32, Format::DecimalExponent));
    }
    None
}

/// `strconv.ParseInt(s, 10, 64)`: optional sign, ASCII digits, no overflow.
fn go_parse_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.strip_prefix('+').unwrap_or(s).parse::<i64>().ok()
}

/// `inf.Dec.SetString` for the numeric part (sign, digits, optional fraction).
fn parse_decimal(value: &str) -> Option<(BigInt, i32)> {
    let (negative, rest) = match value.as_bytes().first() {
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        _ => (false, value),
    };
    let (int_part, frac_part) = match rest.split_once('.') {
        Some((i, f)) => (i, f),
        None => (rest, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let digits = format!("{int_part}{frac_part}");
    if !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let mut unscaled: BigInt = digits.parse().ok()?;
    if negative {
        unscaled = -unscaled;
    }
    Some((unscaled, i32::try_from(frac_part.len()).ok()?))
}

impl Quantity {
    /// True for results of [`Quantity::add`]/[`Quantity::sub`] (Go's `*Quantity`): CEL's
    /// type names and equality overloads tell those apart from parsed quantities.
    pub fn is_arithmetic_result(&self) -> bool {
        self.from_arithmetic
    }

    /// `resource.ParseQuantity`.
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError::FormatWrong);
        }
        if s == "0" {
            return Ok(Self::int(0, 0));
        }
        let parts = split_quantity(s)?;
        let (base, exponent, format) =
            interpret_suffix(parts.suffix).ok_or(QuantityError::Suffix)?;

        let digit_len = (parts.num.len() + parts.denom.len()) as i64;
        let mut scale: i64 = 0;
        let mut mantissa: i64 = 1;
        let precision: i64 = match format {
            Format::DecimalExponent | Format::DecimalSI => {
                scale = exponent as i64;
                18 - digit_len
            }
            Format::BinarySI => {
                if exponent >= 0 && parts.denom.is_empty() {
                    mantissa = 1i64 << exponent;
                    15 - parts.num.len() as i64 - ((exponent as f32) * 3.0 / 10.0) as i64 - 1
                } else {
                    -1
                }
            }
        };
        if precision >= 0 {
            scale -= parts.denom.len() as i64;
            if scale >= -9 {
                // The digits of num and denom as one integer; precision >= 0 bounds them to
                // 18, so i64 holds them. Read in place: allocating them was most of a parse.
                let value = digits_value(parts.num, parts.denom).ok_or(QuantityError::Numeric)?;
                if let Some(mut result) = int64_multiply(value, mantissa) {
                    if !parts.positive {
                        result = result.wrapping_neg();
                    }
                    return Ok(Self::int(result, scale as i32));
                }
            }
        }

        // Slow path: arbitrary precision, rounded up to 1n.
        let (mut unscaled, mut dec_scale) =
            parse_decimal(parts.value).ok_or(QuantityError::Numeric)?;
        if base == 10 {
            dec_scale = dec_scale.wrapping_sub(exponent);
        } else {
            unscaled *= BigInt::from(1u8) << (exponent as usize);
        }
        let negative = unscaled.sign() == Sign::Minus;
        if negative {
            unscaled = -unscaled;
        }
        if !unscaled.is_zero() {
            (unscaled, dec_scale) = round_up_to_scale(unscaled, dec_scale, 9);
        }
        if format == Format::BinarySI {
            let max = BigInt::from(i64::MAX);
            if cmp_dec(&unscaled, dec_scale, &max, 0) == Ordering::Greater {
                unscaled = max;
                dec_scale = 0;
            }
        }
        if negative {
            unscaled = -unscaled;
        }
        Ok(Quantity {
            amount: Amount::Dec {
                unscaled,
                scale: dec_scale,
            },
            from_arithmetic: false,
        })
    }

    fn int(value: i64, scale: i32) -> Quantity {
        Quantity {
            amount: Amount::Int64 { value, scale },
            from_arithmetic: false,
        }
    }

    /// `resource.NewQuantity(v, DecimalExponent)`.
    pub fn from_int(value: i64) -> Quantity {
        Self::int(value, 0)
    }

    /// Value as (mantissa, exp10) with `value = mantissa × 10^exp10`.
    fn mantissa_exp10(&self) -> (BigInt, i64) {
        match &self.amount {
            Amount::Int64 { value, scale } => (BigInt::from(*value), *scale as i64),
            Amount::Dec { unscaled, scale } => (unscaled.clone(), -(*scale as i64)),
        }
    }

    /// inf.Dec view: (unscaled, scale) with value = unscaled × 10^-scale.
    fn as_dec(&self) -> (BigInt, i32) {
        match &self.amount {
            Amount::Int64 { value, scale } => (BigInt::from(*value), scale.wrapping_neg()),
            Amount::Dec { unscaled, scale } => (unscaled.clone(), *scale),
        }
    }

    /// Exact numeric comparison (Go `Quantity.Cmp`).
    pub fn cmp_value(&self, other: &Quantity) -> Ordering {
        match (&self.amount, &other.amount) {
            (
                Amount::Int64 {
                    value: a,
                    scale: sa,
                },
                Amount::Int64 {
                    value: b,
                    scale: sb,
                },
            ) if sa == sb => a.cmp(b),
            _ => {
                let (a, sa) = self.as_dec();
                let (b, sb) = other.as_dec();
                cmp_dec(&a, sa, &b, sb)
            }
        }
    }

    /// Go `Quantity.Value`: the value rounded away from zero to an integer, when it fits an
    /// `i64`.
    pub fn value(&self) -> Option<i64> {
        let (mantissa, exp10) = self.mantissa_exp10();
        let ten = BigInt::from(10);
        let integer = if exp10 >= 0 {
            mantissa * ten.pow(u32::try_from(exp10).ok()?)
        } else {
            let divisor = ten.pow(u32::try_from(-exp10).ok()?);
            let quotient = &mantissa / &divisor;
            if (&mantissa % &divisor).is_zero() {
                quotient
            } else if mantissa.is_negative() {
                quotient - 1
            } else {
                quotient + 1
            }
        };
        integer.to_i64()
    }

    /// The value in thousandths, when it is a whole number of thousandths that fits an `i64`:
    /// what Go's `NewMilliQuantity(q.MilliValue())` gives back equal to `q` (a finer value
    /// rounds, a larger one overflows).
    pub fn exact_milli_value(&self) -> Option<i64> {
        let (mantissa, exp10) = self.mantissa_exp10();
        let exp10 = exp10.checked_add(3)?;
        let ten = BigInt::from(10);
        let milli = if exp10 >= 0 {
            // Past 10^19 no i64 is reached whatever the mantissa (zero aside).
            if exp10 > 19 {
                return mantissa.is_zero().then_some(0);
            }
            mantissa * ten.pow(u32::try_from(exp10).ok()?)
        } else {
            let divisor = ten.pow(u32::try_from(-exp10).ok()?);
            if !(&mantissa % &divisor).is_zero() {
                return None;
            }
            mantissa / divisor
        };
        milli.to_i64()
    }

    /// Whether the value has a fractional part.
    pub fn is_fractional(&self) -> bool {
        let (mantissa, exp10) = self.mantissa_exp10();
        exp10 < 0
            && u32::try_from(-exp10)
                .map(|e| !(mantissa % BigInt::from(10).pow(e)).is_zero())
                .unwrap_or(true)
    }

    pub fn sign(&self) -> i64 {
        match &self.amount {
            Amount::Int64 { value, .. } => value.signum(),
            Amount::Dec { unscaled, .. } => match unscaled.sign() {
                Sign::Minus => -1,
                Sign::NoSign => 0,
                Sign::Plus => 1,
            },
        }
    }

    /// Go `Quantity.AsInt64`: only int64-backed values with a non-negative scale qualify.
    pub fn as_int64(&self) -> Option<i64> {
        match self.amount {
            Amount::Dec { .. } => None,
            Amount::Int64 { value, scale } => {
                if scale == 0 {
                    Some(value)
                } else if scale < 0 {
                    None
                } else {
                    positive_scale_int64(value, scale)
                }
            }
        }
    }

    /// Go `Quantity.AsApproximateFloat64`.
    pub fn as_approximate_float(&self) -> f64 {
        let (base, exponent) = match &self.amount {
            Amount::Dec { unscaled, scale } => {
                (unscaled.to_f64().unwrap_or(f64::NAN), -(*scale as i64))
            }
            Amount::Int64 { value, scale } => (*value as f64, *scale as i64),
        };
        if exponent == 0 {
            base
        } else {
            base * go_pow10(exponent)
        }
    }

    /// Go `Quantity.Add`.
    pub fn add(&self, other: &Quantity) -> Quantity {
        let amount = match (&self.amount, &other.amount) {
            (
                Amount::Int64 {
                    value: a,
                    scale: sa,
                },
                Amount::Int64 {
                    value: b,
                    scale: sb,
                },
            ) => match int64_amount_add(*a, *sa, *b, *sb) {
                Some((value, scale)) => Amount::Int64 { value, scale },
                None => dec_add(self.as_dec(), other.as_dec()),
            },
            _ => dec_add(self.as_dec(), other.as_dec()),
        };
        Quantity {
            amount,
            from_arithmetic: true,
        }
    }

    /// Go `Quantity.Sub`.
    pub fn sub(&self, other: &Quantity) -> Quantity {
        let amount = match (&self.amount, &other.amount) {
            (
                Amount::Int64 {
                    value: a,
                    scale: sa,
                },
                Amount::Int64 {
                    value: b,
                    scale: sb,
                },
            ) => match int64_amount_add(*a, *sa, b.wrapping_neg(), *sb) {
                Some((value, scale)) => Amount::Int64 { value, scale },
                None => {
                    let (bu, bs) = other.as_dec();
                    dec_add(self.as_dec(), (-bu, bs))
                }
            },
            _ => {
                let (bu, bs) = other.as_dec();
                dec_add(self.as_dec(), (-bu, bs))
            }
        };
        Quantity {
            amount,
            from_arithmetic: true,
        }
    }
}

/// Go `int64Amount.Add`; None when it would overflow (Go then falls back to inf.Dec).
fn int64_amount_add(a: i64, sa: i32, b: i64, sb: i32) -> Option<(i64, i32)> {
    if b == 0 {
        return Some((a, sa));
    }
    if a == 0 {
        return Some((b, sb));
    }
    if sa == sb {
        return Some((a.checked_add(b)?, sa));
    }
    if sa > sb {
        let c = positive_scale_int64(a, sa - sb)?;
        Some((c.checked_add(b)?, sb))
    } else {
        let c = positive_scale_int64(b, sb - sa)?;
        Some((a.checked_add(c)?, sa))
    }
}

/// inf.Dec addition: the result takes the larger scale.
fn dec_add((a, sa): (BigInt, i32), (b, sb): (BigInt, i32)) -> Amount {
    let scale = sa.max(sb);
    let a = a * pow10((scale as i64 - sa as i64) as u32);
    let b = b * pow10((scale as i64 - sb as i64) as u32);
    Amount::Dec {
        unscaled: a + b,
        scale,
    }
}

/// inf.Dec `Round(x, s, RoundUp)` for a non-negative unscaled value.
fn round_up_to_scale(unscaled: BigInt, scale: i32, target: i32) -> (BigInt, i32) {
    match scale.cmp(&target) {
        Ordering::Equal => (unscaled, scale),
        Ordering::Less => {
            let shift = (target as i64 - scale as i64) as u32;
            (unscaled * pow10(shift), target)
        }
        Ordering::Greater => {
            let divisor = pow10((scale as i64 - target as i64) as u32);
            let quotient = &unscaled / &divisor;
            let remainder = &unscaled % &divisor;
            let rounded = if remainder.is_zero() {
                quotient
            } else {
                quotient + 1
            };
            (rounded, target)
        }
    }
}

fn decimal_digits(v: &BigInt) -> i64 {
    if v.is_zero() {
        return 0;
    }
    v.abs().to_str_radix(10).len() as i64
}

/// Exact comparison of `a × 10^-sa` and `b × 10^-sb` without expanding huge exponents.
fn cmp_dec(a: &BigInt, sa: i32, b: &BigInt, sb: i32) -> Ordering {
    let sign_a = a.sign();
    let sign_b = b.sign();
    let rank = |s: Sign| match s {
        Sign::Minus => -1,
        Sign::NoSign => 0,
        Sign::Plus => 1,
    };
    match rank(sign_a).cmp(&rank(sign_b)) {
        Ordering::Equal => {}
        other => return other,
    }
    if sign_a == Sign::NoSign {
        return Ordering::Equal;
    }
    // Compare magnitudes by order of magnitude first.
    let mag_a = decimal_digits(a) - sa as i64;
    let mag_b = decimal_digits(b) - sb as i64;
    let magnitude = if mag_a != mag_b {
        mag_a.cmp(&mag_b)
    } else {
        let (ea, eb) = (-(sa as i64), -(sb as i64));
        let low = ea.min(eb);
        let aa = a.abs() * pow10((ea - low) as u32);
        let bb = b.abs() * pow10((eb - low) as u32);
        aa.cmp(&bb)
    };
    if sign_a == Sign::Minus {
        magnitude.reverse()
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values Go's `NewMilliQuantity(q.MilliValue())` gives back unchanged.
    #[test]
    fn exact_milli_values() {
        let milli = |s: &str| Quantity::parse(s).unwrap().exact_milli_value();
        assert_eq!(milli("1.5"), Some(1500));
        assert_eq!(milli("250m"), Some(250));
        assert_eq!(milli("-2"), Some(-2000));
        assert_eq!(milli("1Ki"), Some(1_024_000));
        assert_eq!(milli("0"), Some(0));
        assert_eq!(milli("0.0005"), None, "finer than a thousandth");
        assert_eq!(milli("1u"), None);
        assert_eq!(milli("9223372036854775807m"), Some(i64::MAX));
        assert_eq!(milli("9223372036854775808m"), None, "past i64");
        assert_eq!(milli("10E"), None);
        assert_eq!(milli("1e30"), None);
    }

    /// Go's `Quantity.Value()` (rounded away from zero) and fractional parts.
    #[test]
    fn integer_values_round_away_from_zero() {
        let value = |s: &str| Quantity::parse(s).unwrap().value();
        assert_eq!(value("1Gi"), Some(1 << 30));
        assert_eq!(value("1.5"), Some(2));
        assert_eq!(value("100m"), Some(1));
        assert_eq!(value("-1.5"), Some(-2));
        assert_eq!(value("1e3"), Some(1000));
        assert_eq!(value("10E"), None);
        let fractional = |s: &str| Quantity::parse(s).unwrap().is_fractional();
        assert!(fractional("0.5") && fractional("1500m"));
        assert!(!fractional("2000m") && !fractional("1Gi") && !fractional("1e3"));
    }

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn binary_and_decimal_suffixes_compare_numerically() {
        assert_eq!(q("1Mi"), q("1024Ki"));
        assert_eq!(q("200M"), q("0.2G"));
        assert_eq!(q("1k"), q("1000"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E3"), q("1000"));
        assert_eq!(q("1000m"), q("1"));
        assert!(q("40Gi").cmp_value(&q("80Gi")) == Ordering::Less);
        assert!(q("-1").cmp_value(&q("1n")) == Ordering::Less);
        assert!(q("1e100").cmp_value(&q("99999999999999999999999")) == Ordering::Greater);
    }

    #[test]
    fn malformed_quantities_give_kubernetes_errors() {
        assert_eq!(Quantity::parse(""), Err(QuantityError::FormatWrong));
        assert_eq!(Quantity::parse("abc"), Err(QuantityError::FormatWrong));
        assert_eq!(Quantity::parse("1.5.5"), Err(QuantityError::FormatWrong));
        assert_eq!(Quantity::parse("1Ki5"), Err(QuantityError::Suffix));
        assert_eq!(Quantity::parse("1Q"), Err(QuantityError::FormatWrong));
        assert_eq!(Quantity::parse("1e"), Err(QuantityError::Suffix));
        assert!(Quantity::parse(".").is_ok());
        assert_eq!(q("1."), q("1"));
    }

    #[test]
    fn integer_views_follow_the_go_representation() {
        assert_eq!(q("1k").as_int64(), Some(1000));
        assert_eq!(q("1.0").as_int64(), None);
        assert_eq!(q("1000m").as_int64(), None);
        assert_eq!(q("1Gi").as_int64(), Some(1 << 30));
        assert_eq!(q("1.5Gi").as_int64(), None);
        assert_eq!(q("9999999999999999999999999999999999999G").as_int64(), None);
        assert_eq!(q("1.5Gi").as_approximate_float(), 1610612736.0);
    }

    #[test]
    fn tiny_values_round_up_to_a_nano() {
        assert_eq!(q("1e-20"), q("1n"));
        assert_eq!(q("-1e-20"), q("-1n"));
        assert_eq!(q("0.0000000001"), q("1n"));
    }

    #[test]
    fn binary_values_are_capped_at_int64_max() {
        assert_eq!(q("100000000000Ei"), Quantity::from_int(i64::MAX));
        assert!(q("100000000000E").cmp_value(&Quantity::from_int(i64::MAX)) == Ordering::Greater);
    }

    #[test]
    fn arithmetic_is_exact() {
        assert_eq!(q("1Gi").add(&q("1Gi")), q("2Gi"));
        assert_eq!(q("1").sub(&q("1500m")), q("-500m"));
        assert_eq!(
            q("9223372036854775807")
                .add(&Quantity::from_int(1))
                .as_int64(),
            None
        );
        assert_eq!(
            q("9223372036854775807").add(&Quantity::from_int(1)),
            q("9223372036854775808")
        );
    }
}
