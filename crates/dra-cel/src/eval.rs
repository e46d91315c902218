//! The evaluator over checked program trees, with cel-go's runtime cost accounting and error
//! texts.
use std::cmp::Ordering;
use std::sync::Arc;

use k8s_quantity::Quantity;

use super::check::{Comprehension, Node};
use super::decls::Func;
use super::device::DeviceView;
use super::semver::Semver;
use super::value::{DomainsOf, Equality, MapValue, Value, numeric_cmp};
use super::{format, net, strfmt, time, url};

/// A runtime error. `abort` errors (cost limit) are never absorbed by `&&`, `||` or macros.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalError {
    pub message: Arc<str>,
    pub abort: bool,
}

impl EvalError {
    pub fn new(message: impl Into<Arc<str>>) -> Self {
        EvalError {
            message: message.into(),
            abort: false,
        }
    }
}

type R = Result<Value, EvalError>;

fn err<T>(message: impl Into<Arc<str>>) -> Result<T, EvalError> {
    Err(EvalError::new(message))
}

fn no_such_overload<T>() -> Result<T, EvalError> {
    err("no such overload")
}

pub const COST_LIMIT_MESSAGE: &str = "operation cancelled: actual cost limit exceeded";

pub struct Ctx<'d> {
    pub device: &'d DeviceView,
    pub locals: Vec<R>,
    pub cost: u64,
    pub limit: u64,
}

impl Ctx<'_> {
    #[inline]
    fn charge(&mut self, amount: u64) -> Result<(), EvalError> {
        self.cost = self.cost.saturating_add(amount);
        if self.cost > self.limit {
            return Err(EvalError {
                message: Arc::from(COST_LIMIT_MESSAGE),
                abort: true,
            });
        }
        Ok(())
    }
}

/// Size used by cost functions (cel-go `actualSize`): strings in code points, lists and maps
/// by entries, everything else 1.
fn actual_size(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.chars().count() as u64,
        Value::Bytes(b) => b.len() as u64,
        Value::List(l) => l.len() as u64,
        Value::Map(m) => m.entries.len() as u64,
        // IP and CIDR values report their address length in bytes (`Size()`).
        Value::Ip(a) => addr_len(a),
        Value::Cidr(c) => addr_len(&c.addr),
        _ => 1,
    }
}

fn addr_len(a: &net::Addr) -> u64 {
    match a {
        net::Addr::V4(_) => 4,
        net::Addr::V6(..) => 16,
    }
}

fn ceil_tenth(n: u64) -> u64 {
    ((n as f64) * 0.1).ceil() as u64
}

/// Cost of a call, following cel-go's defaults and Kubernetes' `CostEstimator.CallCost`.
fn call_cost(func: Func, args: &[Value], result: &Value) -> u64 {
    let size = |i: usize| args.get(i).map(actual_size).unwrap_or(0);
    match func {
        Func::StartsWith | Func::EndsWith => ceil_tenth(size(1)),
        Func::In => size(1),
        Func::Eq | Func::Ne => match args.first() {
            Some(Value::Quantity(_) | Value::Semver(_)) => 1,
            _ => ceil_tenth(size(0).min(size(1))),
        },
        Func::Lt | Func::Le | Func::Gt | Func::Ge => match (args.first(), args.get(1)) {
            (Some(Value::String(_) | Value::Bytes(_)), _) => ceil_tenth(size(0).min(size(1))),
            _ => 1,
        },
        Func::Add => match args.first() {
            Some(Value::String(_) | Value::Bytes(_)) => ceil_tenth(size(0) + size(1)),
            _ => 1,
        },
        Func::Matches | Func::Find | Func::FindAll => {
            let str_cost = ((1.0 + size(0) as f64) * 0.1).ceil() as u64;
            let regex_cost = ((size(1) as f64) * 0.25).ceil() as u64;
            str_cost * regex_cost
        }
        Func::Contains => ceil_tenth(size(0)) * ceil_tenth(size(1)),
        Func::IsSorted
        | Func::Sum
        | Func::SumDurations
        | Func::Max
        | Func::Min
        | Func::Includes => size(0),
        Func::IndexOf | Func::LastIndexOf => match args.first() {
            Some(Value::List(_)) => size(0),
            _ => 1,
        },
        Func::LowerAscii | Func::UpperAscii | Func::Substring | Func::Trim => ceil_tenth(size(0)),
        Func::Replace | Func::Split => ((size(0) as f64) * 2.0 * 0.1).ceil() as u64,
        Func::Join => ((actual_size(result) as f64) * 2.0 * 0.1).ceil() as u64,
        Func::Quantity | Func::IsQuantity | Func::Semver | Func::IsSemver => ceil_tenth(size(0)),
        Func::Cidr | Func::IsIp | Func::IsCidr | Func::Url => ceil_tenth(size(0)),
        Func::Ip => match args.first() {
            Some(Value::Cidr(_)) => 1,
            _ => ceil_tenth(size(0)),
        },
        Func::IpIsCanonical => ((size(0) as f64) * 2.0 * 0.1).ceil() as u64,
        Func::ContainsIp | Func::ContainsCidr => {
            let mut cost = ceil_tenth(size(0) * 2);
            if func == Func::ContainsCidr {
                cost += ceil_tenth(size(0)) + 1;
            }
            if matches!(args.get(1), Some(Value::String(_))) {
                cost += ceil_tenth(size(1));
            }
            cost
        }
        Func::FormatValidate => match args.first() {
            Some(Value::Format(f)) => {
                let str_cost = ((1.0 + size(1) as f64) * 0.1).ceil() as u64;
                let regex_cost = ((format::max_regex_size(*f) as f64) * 0.25).ceil() as u64;
                str_cost * regex_cost
            }
            _ => 1,
        },
        Func::ToString | Func::ToBytes | Func::Quote => match args.first() {
            Some(Value::Bytes(_) | Value::String(_)) => ceil_tenth(size(0)),
            _ => 1,
        },
        _ => 1,
    }
}

/// Materializes `device`, `device.attributes` and `device.capacity` as plain maps.
fn materialize(v: &Value, device: &DeviceView) -> Value {
    match v {
        Value::Domains(of) => {
            let entries = device
                .domains(*of)
                .iter()
                .map(|(d, m)| (Value::String(d.clone()), Value::Map(m.clone())))
                .collect();
            Value::Map(Arc::new(MapValue { entries }))
        }
        Value::Device => {
            let entries = vec![
                (
                    Value::string("driver"),
                    Value::String(device.driver.clone()),
                ),
                (
                    Value::string("allowMultipleAllocations"),
                    Value::Bool(device.allow_multiple_allocations),
                ),
                (
                    Value::string("attributes"),
                    materialize(&Value::Domains(DomainsOf::Attributes), device),
                ),
                (
                    Value::string("capacity"),
                    materialize(&Value::Domains(DomainsOf::Capacity), device),
                ),
            ];
            Value::Map(Arc::new(MapValue { entries }))
        }
        other => other.clone(),
    }
}

fn key_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Uint(u) => u.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Double(d) => format_double(*d),
        other => other.type_name().to_string(),
    }
}

/// Go's `%v` of a float64 (shortest digits, exponent form outside 1e-4..1e21), as error
/// messages print doubles.
pub fn format_double(d: f64) -> String {
    format_shortest(d, 21)
}

/// Go's `%g` of a float64 (exponent form from 1e6), as cel-go's `string(double)` prints it.
pub fn format_double_g(d: f64) -> String {
    format_shortest(d, 6)
}

fn format_shortest(d: f64, exp_limit: i32) -> String {
    if d.is_nan() {
        return "NaN".into();
    }
    if d.is_infinite() {
        return if d > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if d == 0.0 {
        return if d.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // The decimal exponent of the shortest representation (log10 can be off by one).
    let exp = format!("{:e}", d.abs())
        .split_once('e')
        .and_then(|(_, e)| e.parse::<i32>().ok())
        .unwrap_or(0);
    if (-4..exp_limit).contains(&exp) {
        format!("{d}")
    } else {
        let s = format!("{d:e}");
        // Rust prints `1e21`; Go prints `1e+21`.
        match s.split_once('e') {
            Some((mantissa, e)) => {
                let (sign, digits) = match e.strip_prefix('-') {
                    Some(rest) => ('-', rest),
                    None => ('+', e),
                };
                let digits = if digits.len() < 2 {
                    format!("0{digits}")
                } else {
                    digits.to_string()
                };
                format!("{mantissa}e{sign}{digits}")
            }
            None => s,
        }
    }
}

/// Looks up `field` in a map-like value (select and index with a string key).
fn select_field(operand: &Value, field: &str, device: &DeviceView) -> R {
    match operand {
        Value::Map(m) => match m.get_str(field) {
            Some(v) => Ok(v.clone()),
            None => err(format!("no such key: {field}")),
        },
        Value::Domains(of) => Ok(Value::Map(
            device
                .domain(*of, field)
                .cloned()
                .unwrap_or_else(|| device.empty.clone()),
        )),
        Value::Device => device_field(field, device),
        Value::List(_) => err("unsupported index type 'string' in list"),
        Value::Optional(_) => err(format!("no such key: {field}")),
        _ => err(format!("no such key: {field}")),
    }
}

fn device_field(field: &str, device: &DeviceView) -> R {
    match field {
        "driver" => Ok(Value::String(device.driver.clone())),
        "allowMultipleAllocations" => Ok(Value::Bool(device.allow_multiple_allocations)),
        "attributes" => Ok(Value::Domains(DomainsOf::Attributes)),
        "capacity" => Ok(Value::Domains(DomainsOf::Capacity)),
        _ => err(format!("no such key: {field}")),
    }
}

fn has_field(operand: &Value, field: &str, _device: &DeviceView) -> R {
    match operand {
        Value::Map(m) => Ok(Value::Bool(m.get_str(field).is_some())),
        // The defaulting map answers every lookup, so presence is always true.
        Value::Domains(_) => Ok(Value::Bool(true)),
        Value::Device => Ok(Value::Bool(matches!(
            field,
            "driver" | "allowMultipleAllocations" | "attributes" | "capacity"
        ))),
        Value::List(_) => err("unsupported index type 'string' in list"),
        _ => Ok(Value::Bool(false)),
    }
}

fn list_index(l: &[Value], index: &Value) -> R {
    let i = match index {
        Value::Int(i) => *i,
        Value::Uint(u) => i64::try_from(*u).unwrap_or(i64::MAX),
        Value::Double(d) if d.fract() == 0.0 && d.is_finite() => *d as i64,
        Value::Double(d) => return err(format!("unsupported index value {}", format_double(*d))),
        other => {
            return err(format!(
                "unsupported index type '{}' in list",
                other.type_name()
            ));
        }
    };
    if i < 0 || i as usize >= l.len() {
        return err(format!("index out of bounds: {i}"));
    }
    Ok(l[i as usize].clone())
}

fn index_value(operand: &Value, index: &Value, device: &DeviceView) -> R {
    match operand {
        Value::List(l) => list_index(l, index),
        Value::Map(m) => match m.get(index) {
            Some(v) => Ok(v.clone()),
            None => err(format!("no such key: {}", key_text(index))),
        },
        Value::Domains(of) => match index {
            Value::String(s) => Ok(Value::Map(
                device
                    .domain(*of, s)
                    .cloned()
                    .unwrap_or_else(|| device.empty.clone()),
            )),
            _ => Ok(Value::Map(device.empty.clone())),
        },
        Value::Device => match index {
            Value::String(s) => device_field(s, device),
            other => err(format!("no such key: {}", key_text(other))),
        },
        _ => err(format!("no such key: {}", key_text(index))),
    }
}

fn compare(a: &Value, b: &Value, op: &str) -> Result<Ordering, EvalError> {
    let trait_less = || err(format!("no such overload: {op}"));
    let ord = match (a, b) {
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bytes(x), Value::Bytes(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::Duration(x), Value::Duration(y)) => Some(x.cmp(y)),
        (Value::Timestamp(x), Value::Timestamp(y)) => Some(x.cmp_instant(y)),
        (Value::Int(_) | Value::Uint(_) | Value::Double(_), _) => match numeric_cmp(a, b) {
            Some(o) => Some(o),
            None => {
                if matches!(b, Value::Int(_) | Value::Uint(_) | Value::Double(_)) {
                    // NaN: every comparison is false.
                    return Ok(Ordering::Equal).and(Err(EvalError::new("__nan__")));
                }
                None
            }
        },
        (
            Value::String(_)
            | Value::Bytes(_)
            | Value::Bool(_)
            | Value::Duration(_)
            | Value::Timestamp(_),
            _,
        ) => None,
        _ => return trait_less(),
    };
    match ord {
        Some(o) => Ok(o),
        None => no_such_overload(),
    }
}

fn compare_op(func: Func, a: &Value, b: &Value) -> R {
    let op = match func {
        Func::Lt => "_<_",
        Func::Le => "_<=_",
        Func::Gt => "_>_",
        _ => "_>=_",
    };
    match compare(a, b, op) {
        Ok(o) => Ok(Value::Bool(match func {
            Func::Lt => o == Ordering::Less,
            Func::Le => o != Ordering::Greater,
            Func::Gt => o == Ordering::Greater,
            _ => o != Ordering::Less,
        })),
        Err(e) if &*e.message == "__nan__" => Ok(Value::Bool(false)),
        Err(e) => Err(e),
    }
}

fn equals(a: &Value, b: &Value, device: &DeviceView) -> Result<bool, EvalError> {
    let (a, b) = if matches!(a, Value::Domains(_) | Value::Device)
        || matches!(b, Value::Domains(_) | Value::Device)
    {
        (materialize(a, device), materialize(b, device))
    } else {
        (a.clone(), b.clone())
    };
    match a.equals(&b) {
        Equality::Equal(e) => Ok(e),
        Equality::NoSuchOverload => no_such_overload(),
    }
}

fn arith(func: Func, a: &Value, b: &Value) -> R {
    use Value::*;
    let op = match func {
        Func::Add => "_+_",
        Func::Sub => "_-_",
        Func::Mul => "_*_",
        Func::Div => "_/_",
        _ => "_%_",
    };
    match (func, a, b) {
        (_, Int(x), Int(y)) => {
            let r = match func {
                Func::Add => x.checked_add(*y),
                Func::Sub => x.checked_sub(*y),
                Func::Mul => x.checked_mul(*y),
                Func::Div => {
                    if *y == 0 {
                        return err("division by zero");
                    }
                    x.checked_div(*y)
                }
                _ => {
                    if *y == 0 {
                        return err("modulus by zero");
                    }
                    x.checked_rem(*y)
                }
            };
            r.map(Int).ok_or_else(|| EvalError::new("integer overflow"))
        }
        (_, Uint(x), Uint(y)) => {
            let r = match func {
                Func::Add => x.checked_add(*y),
                Func::Sub => x.checked_sub(*y),
                Func::Mul => x.checked_mul(*y),
                Func::Div => {
                    if *y == 0 {
                        return err("division by zero");
                    }
                    x.checked_div(*y)
                }
                _ => {
                    if *y == 0 {
                        return err("modulus by zero");
                    }
                    x.checked_rem(*y)
                }
            };
            r.map(Uint)
                .ok_or_else(|| EvalError::new("unsigned integer overflow"))
        }
        (Func::Mod, Double(_), _) => err(format!("no such overload: {op}")),
        (_, Double(x), Double(y)) => Ok(Double(match func {
            Func::Add => x + y,
            Func::Sub => x - y,
            Func::Mul => x * y,
            _ => x / y,
        })),
        (Func::Add, String(x), String(y)) => {
            let mut s = std::string::String::with_capacity(x.len() + y.len());
            s.push_str(x);
            s.push_str(y);
            Ok(Value::String(Arc::from(s)))
        }
        (Func::Add, Bytes(x), Bytes(y)) => {
            let mut v = x.to_vec();
            v.extend_from_slice(y);
            Ok(Value::Bytes(Arc::from(v)))
        }
        (Func::Add, List(x), List(y)) => {
            let mut v = Vec::with_capacity(x.len() + y.len());
            v.extend(x.iter().cloned());
            v.extend(y.iter().cloned());
            Ok(List(Arc::new(v)))
        }
        (Func::Add | Func::Sub, Duration(_) | Timestamp(_), _) => time_arith(func, a, b),
        // Without the operator's trait, cel-go asks the value as a receiver, which declines.
        (_, Duration(_) | Timestamp(_), _) => no_such_overload(),
        (Func::Add, Int(_) | Uint(_) | Double(_) | String(_) | Bytes(_) | List(_), _) => {
            no_such_overload()
        }
        (Func::Sub | Func::Mul | Func::Div, Int(_) | Uint(_) | Double(_), _) => no_such_overload(),
        (Func::Mod, Int(_) | Uint(_), _) => no_such_overload(),
        (Func::Sub | Func::Mul | Func::Div | Func::Mod, String(_) | Bytes(_) | Bool(_), _) => {
            no_such_overload()
        }
        _ => err(format!("no such overload: {op}")),
    }
}

/// `+` and `-` on durations and timestamps (cel-go's checked time arithmetic).
fn time_arith(func: Func, a: &Value, b: &Value) -> R {
    use Value::{Duration, Timestamp};
    let result = match (func, a, b) {
        (Func::Add, Duration(x), Duration(y)) => x
            .checked_add(*y)
            .map(Duration)
            .ok_or(time::INTEGER_OVERFLOW),
        (Func::Sub, Duration(x), Duration(y)) => x
            .checked_sub(*y)
            .map(Duration)
            .ok_or(time::INTEGER_OVERFLOW),
        (Func::Add, Duration(d), Timestamp(t)) | (Func::Add, Timestamp(t), Duration(d)) => {
            t.add_duration(*d).map(Timestamp)
        }
        (Func::Sub, Timestamp(t), Duration(d)) => t.sub_duration(*d).map(Timestamp),
        (Func::Sub, Timestamp(t), Timestamp(u)) => t.since(u).map(Duration),
        _ => return no_such_overload(),
    };
    result.map_err(EvalError::new)
}

fn overload_error<T>(name: &str, args: &[Value]) -> Result<T, EvalError> {
    let types: Vec<&str> = args.iter().map(Value::type_name).collect();
    err(format!("no such overload: {name}({})", types.join(", ")))
}

fn string_arg(v: &Value) -> Option<&str> {
    if let Value::String(s) = v {
        Some(s)
    } else {
        None
    }
}

/// Type conversions, also used for constant folding at compile time.
pub fn convert(func: Func, v: &Value) -> R {
    use Value::*;
    let name = match func {
        Func::ToInt => "int",
        Func::ToUint => "uint",
        Func::ToDouble => "double",
        Func::ToString => "string",
        Func::ToBool => "bool",
        Func::ToBytes => "bytes",
        Func::ToDuration => "duration",
        Func::ToTimestamp => "timestamp",
        _ => "dyn",
    };
    let bad = || overload_error(name, std::slice::from_ref(v));
    match func {
        Func::ToDyn => Ok(v.clone()),
        Func::TypeOf => Ok(Value::Type(Arc::from(v.type_name()))),
        Func::ToInt => match v {
            Int(i) => Ok(Int(*i)),
            Uint(u) => i64::try_from(*u)
                .map(Int)
                .map_err(|_| EvalError::new("integer overflow")),
            Double(d) => {
                if d.is_nan() || *d <= -9.223_372_036_854_776e18 || *d >= 9.223_372_036_854_776e18 {
                    err("integer overflow")
                } else {
                    Ok(Int(d.trunc() as i64))
                }
            }
            String(s) => s
                .parse::<i64>()
                .map(Int)
                .map_err(|_| EvalError::new("type conversion error from 'string' to 'int'")),
            // Nanoseconds, and Unix seconds.
            Duration(d) => Ok(Int(*d)),
            Timestamp(t) => Ok(Int(t.seconds)),
            _ => bad(),
        },
        Func::ToUint => match v {
            Uint(u) => Ok(Uint(*u)),
            Int(i) => u64::try_from(*i)
                .map(Uint)
                .map_err(|_| EvalError::new("unsigned integer overflow")),
            Double(d) => {
                if d.is_nan() || *d < 0.0 || *d >= 1.844_674_407_370_955_2e19 {
                    err("unsigned integer overflow")
                } else {
                    Ok(Uint(d.trunc() as u64))
                }
            }
            String(s) => s
                .parse::<u64>()
                .map(Uint)
                .map_err(|_| EvalError::new("type conversion error from 'string' to 'uint'")),
            _ => bad(),
        },
        Func::ToDouble => match v {
            Double(d) => Ok(Double(*d)),
            Int(i) => Ok(Double(*i as f64)),
            Uint(u) => Ok(Double(*u as f64)),
            String(s) => parse_go_float(s)
                .map(Double)
                .ok_or_else(|| EvalError::new("type conversion error from 'string' to 'double'")),
            _ => bad(),
        },
        Func::ToString => match v {
            String(s) => Ok(String(s.clone())),
            Int(i) => Ok(Value::string(&i.to_string())),
            Uint(u) => Ok(Value::string(&u.to_string())),
            Double(d) => Ok(Value::string(&format_double_g(*d))),
            Bool(b) => Ok(Value::string(if *b { "true" } else { "false" })),
            Bytes(b) => match std::str::from_utf8(b) {
                Ok(s) => Ok(Value::string(s)),
                Err(_) => err("invalid UTF-8 in bytes, cannot convert to string"),
            },
            Ip(a) => Ok(Value::string(&a.to_string())),
            Cidr(c) => Ok(Value::string(&c.to_string())),
            Duration(d) => Ok(Value::string(&time::format_duration(*d))),
            Timestamp(t) => Ok(Value::string(&t.to_rfc3339())),
            _ => bad(),
        },
        Func::ToBool => match v {
            Bool(b) => Ok(Bool(*b)),
            String(s) => match &**s {
                "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(Bool(true)),
                "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(Bool(false)),
                _ => err("type conversion error from 'string' to 'bool'"),
            },
            _ => bad(),
        },
        Func::ToBytes => match v {
            Bytes(b) => Ok(Bytes(b.clone())),
            String(s) => Ok(Bytes(Arc::from(s.as_bytes()))),
            _ => bad(),
        },
        Func::ToDuration => match v {
            Duration(d) => Ok(Duration(*d)),
            String(s) => time::parse_duration(s).map(Duration).ok_or_else(|| {
                EvalError::new("type conversion error from 'string' to 'google.protobuf.Duration'")
            }),
            _ => bad(),
        },
        Func::ToTimestamp => match v {
            Timestamp(t) => Ok(Timestamp(*t)),
            Int(i) => time::Timestamp::from_unix(*i)
                .map(Timestamp)
                .map_err(EvalError::new),
            String(s) => match time::Timestamp::parse(s) {
                Ok(Some(t)) => Ok(Timestamp(t)),
                Ok(None) => {
                    err("type conversion error from 'string' to 'google.protobuf.Timestamp'")
                }
                Err(e) => err(e),
            },
            _ => bad(),
        },
        _ => bad(),
    }
}

/// Go's `strconv.ParseFloat` for the forms cel-go accepts.
fn parse_go_float(s: &str) -> Option<f64> {
    let lower = s.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if matches!(body, "inf" | "infinity") {
        return Some(if lower.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
    }
    if body == "nan" {
        return Some(f64::NAN);
    }
    if body.is_empty()
        || !body
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'+' | b'-' | b'_'))
    {
        return None;
    }
    s.replace('_', "").parse::<f64>().ok()
}

fn quantity_arg<'a>(name: &str, args: &'a [Value], i: usize) -> Result<&'a Quantity, EvalError> {
    match args.get(i) {
        Some(Value::Quantity(q)) => Ok(q),
        _ => overload_error(name, args),
    }
}

fn semver_arg<'a>(name: &str, args: &'a [Value], i: usize) -> Result<&'a Semver, EvalError> {
    match args.get(i) {
        Some(Value::Semver(s)) => Ok(s),
        _ => overload_error(name, args),
    }
}

fn int_arg(name: &str, args: &[Value], i: usize) -> Result<i64, EvalError> {
    match args.get(i) {
        Some(Value::Int(v)) => Ok(*v),
        _ => overload_error(name, args),
    }
}

fn str_arg<'a>(name: &str, args: &'a [Value], i: usize) -> Result<&'a str, EvalError> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s),
        _ => overload_error(name, args),
    }
}

fn list_arg<'a>(name: &str, args: &'a [Value], i: usize) -> Result<&'a Arc<Vec<Value>>, EvalError> {
    match args.get(i) {
        Some(Value::List(l)) => Ok(l),
        _ => overload_error(name, args),
    }
}

fn list_value(items: Vec<Value>) -> Value {
    Value::List(Arc::new(items))
}

fn string_list(items: impl IntoIterator<Item = String>) -> Value {
    list_value(
        items
            .into_iter()
            .map(|s| Value::String(Arc::from(s)))
            .collect(),
    )
}

/// Ordering used by `sort`, `min`, `max`, `isSorted`: same-type values only.
fn ordering_for_list(
    a: &Value,
    b: &Value,
    name: &str,
    args: &[Value],
) -> Result<Ordering, EvalError> {
    match (a, b) {
        (Value::Quantity(x), Value::Quantity(y)) => Ok(x.cmp_value(y)),
        (Value::Semver(x), Value::Semver(y)) => Ok(x.compare(y)),
        _ => match compare(a, b, "_<_") {
            Ok(o) => Ok(o),
            Err(e) if &*e.message == "__nan__" => Ok(Ordering::Equal),
            Err(_) => overload_error(name, args),
        },
    }
}

fn rune_index_of(haystack: &str, needle: &str, start_runes: usize) -> Option<usize> {
    let chars: Vec<char> = haystack.chars().collect();
    let needle: Vec<char> = needle.chars().collect();
    if needle.is_empty() {
        return Some(start_runes);
    }
    if needle.len() > chars.len() {
        return None;
    }
    (start_runes..=chars.len() - needle.len()).find(|&i| chars[i..i + needle.len()] == needle[..])
}

fn rune_last_index_of(haystack: &str, needle: &str, last_start: usize) -> Option<usize> {
    let chars: Vec<char> = haystack.chars().collect();
    let needle: Vec<char> = needle.chars().collect();
    if needle.is_empty() {
        return Some(last_start);
    }
    if needle.len() > chars.len() {
        return None;
    }
    let upper = last_start.min(chars.len() - needle.len());
    (0..=upper)
        .rev()
        .find(|&i| chars[i..i + needle.len()] == needle[..])
}

fn go_quote_cel(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Calls a library function on evaluated arguments (receiver first).
pub fn call(func: Func, args: &[Value], device: &DeviceView) -> R {
    use Value::*;
    let a0 = args.first().unwrap_or(&Null);
    let a1 = args.get(1).unwrap_or(&Null);
    match func {
        Func::Eq => equals(a0, a1, device).map(Bool),
        Func::Ne => equals(a0, a1, device).map(|e| Bool(!e)),
        Func::Lt | Func::Le | Func::Gt | Func::Ge => compare_op(func, a0, a1),
        Func::Add | Func::Sub | Func::Mul | Func::Div | Func::Mod => arith(func, a0, a1),
        Func::Neg => match a0 {
            Int(i) => i
                .checked_neg()
                .map(Int)
                .ok_or_else(|| EvalError::new("integer overflow")),
            Double(d) => Ok(Double(-d)),
            // Durations negate at run time (`-dyn(d)`), though no overload declares it.
            Duration(d) => d
                .checked_neg()
                .map(Duration)
                .ok_or_else(|| EvalError::new(time::INTEGER_OVERFLOW)),
            Uint(_) | String(_) | Bytes(_) | Bool(_) | Timestamp(_) => no_such_overload(),
            _ => err("no such overload: -_"),
        },
        Func::Not => match a0 {
            Bool(b) => Ok(Bool(!b)),
            _ => no_such_overload(),
        },
        Func::In => match materialize(a1, device) {
            List(l) => {
                for el in l.iter() {
                    if let Equality::Equal(true) = materialize(a0, device).equals(el) {
                        return Ok(Bool(true));
                    }
                }
                Ok(Bool(false))
            }
            Map(m) => Ok(Bool(m.contains(a0))),
            _ => no_such_overload(),
        },
        Func::Index | Func::OptIndex if matches!(a1, Duration(_) | Timestamp(_)) => {
            err(invalid_qualifier(a1))
        }
        Func::Index => index_value(a0, a1, device),
        Func::Size => match materialize(a0, device) {
            String(s) => Ok(Int(s.chars().count() as i64)),
            Bytes(b) => Ok(Int(b.len() as i64)),
            List(l) => Ok(Int(l.len() as i64)),
            Map(m) => Ok(Int(m.entries.len() as i64)),
            Duration(_) | Timestamp(_) => no_such_overload(),
            _ => err("no such overload: size"),
        },
        Func::Contains | Func::StartsWith | Func::EndsWith => match (a0, a1) {
            (String(s), String(p)) => Ok(Bool(match func {
                Func::Contains => s.contains(&**p),
                Func::StartsWith => s.starts_with(&**p),
                _ => s.ends_with(&**p),
            })),
            _ => no_such_overload(),
        },
        Func::Matches => match (a0, a1) {
            (String(s), String(p)) => {
                let re = super::regex::cached(p).map_err(|e| EvalError::new(e.to_string()))?;
                Ok(Bool(re.is_match(s)))
            }
            _ => no_such_overload(),
        },
        Func::Find | Func::FindAll => {
            let (String(s), String(p)) = (a0, a1) else {
                return no_such_overload();
            };
            let re = super::regex::cached(p).map_err(|e| EvalError::new(e.to_string()))?;
            if func == Func::Find {
                return Ok(Value::string(re.find(s).map(|m| m.as_str()).unwrap_or("")));
            }
            let limit = match args.get(2) {
                Some(Int(n)) => *n,
                Some(_) => return no_such_overload(),
                None => -1,
            };
            if limit == 0 {
                return Ok(list_value(Vec::new()));
            }
            let found = re.find_iter(s).map(|m| m.as_str().to_string());
            let found: Vec<std::string::String> = if limit < 0 {
                found.collect()
            } else {
                found.take(limit as usize).collect()
            };
            Ok(string_list(found))
        }
        Func::ToInt
        | Func::ToUint
        | Func::ToDouble
        | Func::ToString
        | Func::ToBool
        | Func::ToBytes
        | Func::ToDyn
        | Func::ToDuration
        | Func::ToTimestamp
        | Func::TypeOf => convert(func, a0),
        Func::TimeGet(field) => time_field(field, args),
        Func::Quantity => match a0 {
            String(s) => k8s_quantity::Quantity::parse(s)
                .map(|q| Value::Quantity(Arc::new(q)))
                .map_err(|e| EvalError::new(e.to_string())),
            _ => overload_error("quantity", args),
        },
        Func::IsQuantity => match a0 {
            String(s) => Ok(Bool(k8s_quantity::Quantity::parse(s).is_ok())),
            _ => overload_error("isQuantity", args),
        },
        Func::Sign => Ok(Int(quantity_arg("sign", args, 0)?.sign())),
        Func::IsGreaterThan | Func::IsLessThan | Func::CompareTo => {
            let name = match func {
                Func::IsGreaterThan => "isGreaterThan",
                Func::IsLessThan => "isLessThan",
                _ => "compareTo",
            };
            let ord = match (a0, a1) {
                (Value::Quantity(x), Value::Quantity(y)) => x.cmp_value(y),
                (Value::Semver(x), Value::Semver(y)) => x.compare(y),
                (Value::Quantity(_), _) | (Value::Semver(_), _) => return no_such_overload(),
                _ => return overload_error(name, args),
            };
            Ok(match func {
                Func::IsGreaterThan => Bool(ord == Ordering::Greater),
                Func::IsLessThan => Bool(ord == Ordering::Less),
                _ => Int(ord as i64),
            })
        }
        Func::QuantityAdd | Func::QuantitySub => {
            let name = if func == Func::QuantityAdd {
                "add"
            } else {
                "sub"
            };
            let q = quantity_arg(name, args, 0)?;
            let other = match a1 {
                Value::Quantity(o) => (**o).clone(),
                Int(i) => k8s_quantity::Quantity::from_int(*i),
                _ => return no_such_overload(),
            };
            let r = if func == Func::QuantityAdd {
                q.add(&other)
            } else {
                q.sub(&other)
            };
            Ok(Value::Quantity(Arc::new(r)))
        }
        Func::AsInteger => quantity_arg("asInteger", args, 0)?
            .as_int64()
            .map(Int)
            .ok_or_else(|| EvalError::new("cannot convert value to integer")),
        Func::AsApproximateFloat => Ok(Double(
            quantity_arg("asApproximateFloat", args, 0)?.as_approximate_float(),
        )),
        Func::IsInteger => Ok(Bool(
            quantity_arg("isInteger", args, 0)?.as_int64().is_some(),
        )),
        Func::Semver | Func::IsSemver => {
            let name = if func == Func::Semver {
                "semver"
            } else {
                "isSemver"
            };
            let s = str_arg(name, args, 0)?;
            let normalize = match args.get(1) {
                None => false,
                Some(Bool(b)) => *b,
                Some(_) => return no_such_overload(),
            };
            let parsed = if normalize {
                super::semver::Semver::parse_normalized(s)
            } else {
                super::semver::Semver::parse(s)
            };
            if func == Func::IsSemver {
                return Ok(Bool(parsed.is_ok()));
            }
            parsed
                .map(|v| Value::Semver(Arc::new(v)))
                .map_err(|e| EvalError::new(e.0))
        }
        Func::Major => Ok(Int(semver_arg("major", args, 0)?.major as i64)),
        Func::Minor => Ok(Int(semver_arg("minor", args, 0)?.minor as i64)),
        Func::Patch => Ok(Int(semver_arg("patch", args, 0)?.patch as i64)),
        Func::CharAt => {
            let s = str_arg("charAt", args, 0)?;
            let i = int_arg("charAt", args, 1)?;
            let len = s.chars().count() as i64;
            if i < 0 || i > len {
                return err(format!("index out of range: {i}"));
            }
            Ok(Value::string(
                &s.chars()
                    .nth(i as usize)
                    .map(std::string::String::from)
                    .unwrap_or_default(),
            ))
        }
        Func::IndexOf | Func::LastIndexOf => {
            let name = if func == Func::IndexOf {
                "indexOf"
            } else {
                "lastIndexOf"
            };
            match a0 {
                List(l) => {
                    let pos = if func == Func::IndexOf {
                        l.iter()
                            .position(|x| matches!(x.equals(a1), Equality::Equal(true)))
                    } else {
                        l.iter()
                            .rposition(|x| matches!(x.equals(a1), Equality::Equal(true)))
                    };
                    Ok(Int(pos.map(|p| p as i64).unwrap_or(-1)))
                }
                String(s) => {
                    let sub = str_arg(name, args, 1)?;
                    let len = s.chars().count() as i64;
                    let found = if func == Func::IndexOf {
                        let start = match args.get(2) {
                            None => 0,
                            Some(Int(i)) => *i,
                            Some(_) => return overload_error(name, args),
                        };
                        // As cel-go's indexOfOffset: only a negative offset is an error; the
                        // empty string matches at the offset clamped to the end, anything else
                        // is not found past the end.
                        if start < 0 {
                            return err(format!("index out of range: {start}"));
                        }
                        if sub.is_empty() {
                            Some(start.min(len) as usize)
                        } else if start >= len {
                            None
                        } else {
                            rune_index_of(s, sub, start as usize)
                        }
                    } else {
                        let start = match args.get(2) {
                            None => len,
                            Some(Int(i)) => *i,
                            Some(_) => return overload_error(name, args),
                        };
                        if args.len() > 2 && start < 0 {
                            return err(format!("index out of range: {start}"));
                        }
                        if args.len() > 2 && sub.is_empty() {
                            Some(start.min(len) as usize)
                        } else if args.len() > 2 && start >= len {
                            None
                        } else {
                            rune_last_index_of(s, sub, start as usize)
                        }
                    };
                    Ok(Int(found.map(|p| p as i64).unwrap_or(-1)))
                }
                _ => overload_error(name, args),
            }
        }
        Func::LowerAscii => Ok(Value::string(
            &str_arg("lowerAscii", args, 0)?.to_ascii_lowercase(),
        )),
        Func::UpperAscii => Ok(Value::string(
            &str_arg("upperAscii", args, 0)?.to_ascii_uppercase(),
        )),
        Func::Trim => Ok(Value::string(str_arg("trim", args, 0)?.trim_matches(
            |c: char| c.is_whitespace() || c == '\u{85}' || c == '\u{a0}',
        ))),
        Func::Replace => {
            let s = str_arg("replace", args, 0)?;
            let old = str_arg("replace", args, 1)?;
            let new = str_arg("replace", args, 2)?;
            let n = match args.get(3) {
                None => -1,
                Some(Int(n)) => *n,
                Some(_) => return overload_error("replace", args),
            };
            Ok(Value::string(&go_replace(s, old, new, n)))
        }
        Func::Split => {
            let s = str_arg("split", args, 0)?;
            let sep = str_arg("split", args, 1)?;
            let n = match args.get(2) {
                None => -1,
                Some(Int(n)) => *n,
                Some(_) => return overload_error("split", args),
            };
            Ok(string_list(go_split_n(s, sep, n)))
        }
        Func::Substring => {
            let s = str_arg("substring", args, 0)?;
            let chars: Vec<char> = s.chars().collect();
            let len = chars.len() as i64;
            let start = int_arg("substring", args, 1)?;
            if start < 0 || start > len {
                return err(format!("index out of range: {start}"));
            }
            let end = match args.get(2) {
                None => len,
                Some(Int(e)) => *e,
                Some(_) => return overload_error("substring", args),
            };
            if args.len() > 2 {
                if end < 0 || end > len {
                    return err(format!("index out of range: {end}"));
                }
                if start > end {
                    return err(format!(
                        "invalid substring range. start: {start}, end: {end}"
                    ));
                }
            }
            Ok(Value::string(
                &chars[start as usize..end as usize]
                    .iter()
                    .collect::<std::string::String>(),
            ))
        }
        Func::Join => {
            let l = list_arg("join", args, 0)?;
            let sep = match args.get(1) {
                None => "",
                Some(String(s)) => s,
                Some(_) => return overload_error("join", args),
            };
            let mut parts = Vec::with_capacity(l.len());
            for el in l.iter() {
                match el {
                    String(s) => parts.push(s.to_string()),
                    _ => return overload_error("join", args),
                }
            }
            Ok(Value::string(&parts.join(sep)))
        }
        Func::Quote => Ok(Value::string(&go_quote_cel(str_arg(
            "strings.quote",
            args,
            0,
        )?))),
        Func::IsSorted | Func::Sum | Func::SumDurations | Func::Min | Func::Max => {
            let name = match func {
                Func::IsSorted => "isSorted",
                Func::Sum | Func::SumDurations => "sum",
                Func::Min => "min",
                _ => "max",
            };
            let l = list_arg(name, args, 0)?;
            match func {
                Func::IsSorted => {
                    for w in l.windows(2) {
                        if ordering_for_list(&w[0], &w[1], name, args)? == Ordering::Greater {
                            return Ok(Bool(false));
                        }
                    }
                    Ok(Bool(true))
                }
                Func::Sum | Func::SumDurations => {
                    let mut acc: Option<Value> = None;
                    for el in l.iter() {
                        if !matches!(el, Int(_) | Uint(_) | Double(_) | Duration(_)) {
                            return overload_error(name, args);
                        }
                        acc = Some(match acc {
                            None => el.clone(),
                            Some(a) => arith(Func::Add, &a, el)?,
                        });
                    }
                    let zero = if func == Func::SumDurations {
                        Duration(0)
                    } else {
                        Int(0)
                    };
                    Ok(acc.unwrap_or(zero))
                }
                _ => {
                    let Some(first) = l.first() else {
                        return err(format!("{name} called on empty list"));
                    };
                    let mut best = first.clone();
                    for el in l.iter().skip(1) {
                        let o = ordering_for_list(el, &best, name, args)?;
                        if (func == Func::Min && o == Ordering::Less)
                            || (func == Func::Max && o == Ordering::Greater)
                        {
                            best = el.clone();
                        }
                    }
                    Ok(best)
                }
            }
        }
        Func::Includes => match a0 {
            List(l) => Ok(Bool(
                l.iter()
                    .any(|x| matches!(x.equals(a1), Equality::Equal(true))),
            )),
            other => equals(other, a1, device).map(Bool),
        },
        Func::ListsRange => {
            let n = int_arg("lists.range", args, 0)?;
            if n < 0 {
                return err(format!("lists.range: size must be non-negative, got {n}"));
            }
            Ok(list_value((0..n).map(Int).collect()))
        }
        Func::Slice => {
            let l = list_arg("slice", args, 0)?;
            let start = int_arg("slice", args, 1)?;
            let end = int_arg("slice", args, 2)?;
            if start < 0 || end < 0 {
                return err(format!(
                    "cannot slice({start}, {end}), negative indexes not supported"
                ));
            }
            if start > end {
                return err(format!(
                    "cannot slice({start}, {end}), start index must be less than or equal to end index"
                ));
            }
            if end as usize > l.len() {
                return err(format!(
                    "cannot slice({start}, {end}), list is length {}",
                    l.len()
                ));
            }
            Ok(list_value(l[start as usize..end as usize].to_vec()))
        }
        Func::Flatten => {
            let l = list_arg("flatten", args, 0)?;
            let depth = match args.get(1) {
                None => 1,
                Some(Int(d)) => *d,
                Some(_) => return overload_error("flatten", args),
            };
            if depth < 0 {
                return err("level must be non-negative");
            }
            let mut out = Vec::new();
            flatten_into(l, depth, &mut out);
            Ok(list_value(out))
        }
        Func::Distinct => {
            let l = list_arg("distinct", args, 0)?;
            let mut out: Vec<Value> = Vec::new();
            for el in l.iter() {
                if !out
                    .iter()
                    .any(|x| matches!(x.equals(el), Equality::Equal(true)))
                {
                    out.push(el.clone());
                }
            }
            Ok(list_value(out))
        }
        Func::Reverse => {
            let l = list_arg("reverse", args, 0)?;
            Ok(list_value(l.iter().rev().cloned().collect()))
        }
        Func::Sort | Func::SortTracked => {
            let l = list_arg("sort", args, 0)?;
            let mut out = l.to_vec();
            let mut failure = None;
            out.sort_by(|a, b| match ordering_for_list(a, b, "sort", args) {
                Ok(o) => o,
                Err(e) => {
                    failure.get_or_insert(e);
                    Ordering::Equal
                }
            });
            match failure {
                Some(e) => Err(e),
                None => Ok(list_value(out)),
            }
        }
        Func::First | Func::Last => {
            let name = if func == Func::First { "first" } else { "last" };
            let l = list_arg(name, args, 0)?;
            let el = if func == Func::First {
                l.first()
            } else {
                l.last()
            };
            Ok(Optional(el.map(|v| Arc::new(v.clone()))))
        }
        Func::SetsContains | Func::SetsEquivalent | Func::SetsIntersects => {
            let name = match func {
                Func::SetsContains => "sets.contains",
                Func::SetsEquivalent => "sets.equivalent",
                _ => "sets.intersects",
            };
            let (List(a), List(b)) = (a0, a1) else {
                return overload_error(name, args);
            };
            let has = |l: &[Value], x: &Value| {
                l.iter()
                    .any(|y| matches!(y.equals(x), Equality::Equal(true)))
            };
            Ok(Bool(match func {
                Func::SetsContains => b.iter().all(|x| has(a, x)),
                Func::SetsEquivalent => b.iter().all(|x| has(a, x)) && a.iter().all(|x| has(b, x)),
                _ => b.iter().any(|x| has(a, x)),
            }))
        }
        Func::OptionalOf => Ok(Optional(Some(Arc::new(a0.clone())))),
        Func::OptionalNone => Ok(Optional(None)),
        Func::OptionalOfNonZeroValue => {
            let zero = match a0 {
                Null => true,
                Bool(b) => !b,
                Int(i) => *i == 0,
                Uint(u) => *u == 0,
                Double(d) => *d == 0.0,
                String(s) => s.is_empty(),
                Bytes(b) => b.is_empty(),
                List(l) => l.is_empty(),
                Map(m) => m.entries.is_empty(),
                Optional(o) => o.is_none(),
                Duration(d) => *d == 0,
                Timestamp(t) => t.is_zero(),
                _ => false,
            };
            Ok(Optional(if zero {
                None
            } else {
                Some(Arc::new(a0.clone()))
            }))
        }
        Func::OptionalUnwrap => {
            let name = if args.len() == 1 {
                "optional.unwrap"
            } else {
                "unwrapOpt"
            };
            let l = list_arg(name, args, 0)?;
            let mut out = Vec::new();
            for el in l.iter() {
                match el {
                    Optional(Some(v)) => out.push((**v).clone()),
                    Optional(None) => {}
                    _ => return overload_error(name, args),
                }
            }
            Ok(list_value(out))
        }
        Func::HasValue => match a0 {
            Optional(o) => Ok(Bool(o.is_some())),
            _ => overload_error("hasValue", args),
        },
        Func::OptValue => match a0 {
            Optional(Some(v)) => Ok((**v).clone()),
            Optional(None) => err("optional.none() dereference"),
            _ => overload_error("value", args),
        },
        Func::OptOr | Func::OptOrValue => match a0 {
            Optional(Some(_)) if func == Func::OptOr => Ok(a0.clone()),
            Optional(Some(v)) => Ok((**v).clone()),
            Optional(None) => Ok(a1.clone()),
            _ => no_such_overload(),
        },
        Func::OptSelect => {
            let field = string_arg(a1).unwrap_or_default();
            match a0 {
                Optional(None) => Ok(Optional(None)),
                Optional(Some(inner)) => opt_select(inner, field, device),
                other => opt_select(other, field, device),
            }
        }
        Func::MapInsert => match a0 {
            Map(m) => {
                let mut entries = m.entries.clone();
                entries.push((a1.clone(), args.get(2).cloned().unwrap_or(Null)));
                Ok(Map(Arc::new(MapValue { entries })))
            }
            _ => no_such_overload(),
        },
        Func::MapMerge => match (a0, a1) {
            (Map(m), Map(update)) => {
                let mut entries = m.entries.clone();
                for (k, v) in &update.entries {
                    if m.contains(k) {
                        return err(format!("insert failed: key {} already exists", key_text(k)));
                    }
                    entries.push((k.clone(), v.clone()));
                }
                Ok(Map(Arc::new(MapValue { entries })))
            }
            _ => no_such_overload(),
        },
        Func::Ip => match a0 {
            String(s) => net::k8s_ip(s)
                .map(|a| Ip(Arc::new(a)))
                .map_err(EvalError::new),
            Cidr(c) => Ok(Ip(Arc::new(c.addr.clone()))),
            _ => overload_error("ip", args),
        },
        Func::IsIp => Ok(Bool(net::k8s_ip(str_arg("isIP", args, 0)?).is_ok())),
        Func::IpIsCanonical => {
            let s = str_arg("ip.isCanonical", args, 0)?;
            let addr = net::k8s_ip(s).map_err(EvalError::new)?;
            Ok(Bool(addr.to_string() == s))
        }
        Func::Family
        | Func::IsUnspecified
        | Func::IsLoopback
        | Func::IsLinkLocalMulticast
        | Func::IsLinkLocalUnicast
        | Func::IsGlobalUnicast => {
            let Ip(a) = a0 else {
                return no_such_overload();
            };
            Ok(match func {
                Func::Family => Int(a.family()),
                Func::IsUnspecified => Bool(a.is_unspecified()),
                Func::IsLoopback => Bool(a.is_loopback()),
                Func::IsLinkLocalMulticast => Bool(a.is_link_local_multicast()),
                Func::IsLinkLocalUnicast => Bool(a.is_link_local_unicast()),
                _ => Bool(a.is_global_unicast()),
            })
        }
        Func::StringFormat => match (a0, a1) {
            (String(f), List(items)) => {
                let items: Vec<Value> = items.iter().map(|v| materialize(v, device)).collect();
                strfmt::format(f, &items)
                    .map(|s| Value::string(&s))
                    .map_err(EvalError::new)
            }
            _ => no_such_overload(),
        },
        Func::Url => url::k8s_url(str_arg("url", args, 0)?)
            .map(|u| Url(Arc::new(u)))
            .map_err(EvalError::new),
        Func::IsUrl => Ok(Bool(url::is_url(str_arg("isURL", args, 0)?))),
        Func::GetScheme
        | Func::GetHost
        | Func::GetHostname
        | Func::GetPort
        | Func::GetEscapedPath
        | Func::GetQuery => {
            let Url(u) = a0 else {
                return no_such_overload();
            };
            Ok(match func {
                Func::GetScheme => Value::string(&u.scheme()),
                Func::GetHost => Value::string(&u.host()),
                Func::GetHostname => Value::string(&u.hostname()),
                Func::GetPort => Value::string(&u.port()),
                Func::GetEscapedPath => Value::string(&u.escaped_path()),
                _ => {
                    let entries = u
                        .query()
                        .into_iter()
                        .map(|(k, vs)| {
                            let vs = vs.iter().map(|v| Value::string(v)).collect();
                            (Value::string(&k), List(Arc::new(vs)))
                        })
                        .collect();
                    Map(Arc::new(MapValue { entries }))
                }
            })
        }
        Func::Cidr => net::k8s_cidr(str_arg("cidr", args, 0)?)
            .map(|p| Cidr(Arc::new(p)))
            .map_err(EvalError::new),
        Func::IsCidr => Ok(Bool(net::k8s_cidr(str_arg("isCIDR", args, 0)?).is_ok())),
        Func::ContainsIp => {
            let Cidr(c) = a0 else {
                return no_such_overload();
            };
            match a1 {
                Ip(a) => Ok(Bool(c.contains(a))),
                // A parse failure reaches cidrContainsIP as an error value, which it reports
                // as a missing overload.
                String(s) => match net::k8s_ip(s) {
                    Ok(a) => Ok(Bool(c.contains(&a))),
                    Err(_) => no_such_overload(),
                },
                _ => no_such_overload(),
            }
        }
        Func::ContainsCidr => {
            let Cidr(c) = a0 else {
                return no_such_overload();
            };
            match a1 {
                Cidr(o) => Ok(Bool(c.contains_prefix(o))),
                String(s) => {
                    let o = net::k8s_cidr(s).map_err(EvalError::new)?;
                    Ok(Bool(c.contains_prefix(&o)))
                }
                _ => no_such_overload(),
            }
        }
        Func::PrefixLength => match a0 {
            Cidr(c) => Ok(Int(i64::from(c.bits))),
            _ => no_such_overload(),
        },
        Func::Masked => match a0 {
            Cidr(c) => Ok(Cidr(Arc::new(c.masked()))),
            _ => no_such_overload(),
        },
        Func::FormatConst(i) => Ok(Format(i)),
        Func::FormatNamed => {
            let name = str_arg("format.named", args, 0)?;
            Ok(Optional(
                format::index_of(name).map(|i| Arc::new(Format(i))),
            ))
        }
        Func::FormatValidate => {
            let Format(f) = a0 else {
                return no_such_overload();
            };
            let s = str_arg("validate", args, 1)?;
            let errors = format::validate(*f, s);
            if errors.is_empty() {
                Ok(Optional(None))
            } else {
                Ok(Optional(Some(Arc::new(string_list(errors)))))
            }
        }
        Func::OptIndex => match a0 {
            Optional(None) => Ok(Optional(None)),
            Optional(Some(inner)) => opt_index(inner, a1, device),
            other => opt_index(other, a1, device),
        },
    }
}

/// cel-go's error for an index its attribute qualifiers cannot take (durations, timestamps).
pub fn invalid_qualifier(index: &Value) -> String {
    format!("invalid qualifier type: {}", index.go_type_name())
}

/// A timestamp or duration accessor; the optional second argument is a time zone.
fn time_field(field: time::TimeField, args: &[Value]) -> R {
    match args {
        [Value::Timestamp(t)] => t.fields_in(None),
        [Value::Timestamp(t), Value::String(zone)] => t.fields_in(Some(zone)),
        [Value::Duration(d)] if field.on_durations() => {
            return Ok(Value::Int(field.of_duration(*d)));
        }
        _ => return overload_error(field.name(), args),
    }
    .map(|civil| Value::Int(field.of_timestamp(&civil)))
    .map_err(EvalError::new)
}

fn opt_select(v: &Value, field: &str, device: &DeviceView) -> R {
    match has_field(v, field, device)? {
        Value::Bool(true) => Ok(Value::Optional(Some(Arc::new(select_field(
            v, field, device,
        )?)))),
        _ => Ok(Value::Optional(None)),
    }
}

fn opt_index(v: &Value, index: &Value, device: &DeviceView) -> R {
    match v {
        Value::List(l) => match list_index(l, index) {
            Ok(x) => Ok(Value::Optional(Some(Arc::new(x)))),
            Err(e) if e.message.starts_with("index out of bounds") => Ok(Value::Optional(None)),
            Err(e) => Err(e),
        },
        Value::Map(m) => Ok(Value::Optional(m.get(index).map(|x| Arc::new(x.clone())))),
        Value::Domains(_) | Value::Device => {
            index_value(v, index, device).map(|x| Value::Optional(Some(Arc::new(x))))
        }
        _ => Ok(Value::Optional(None)),
    }
}

fn flatten_into(l: &[Value], depth: i64, out: &mut Vec<Value>) {
    for el in l {
        match el {
            Value::List(inner) if depth > 0 => flatten_into(inner, depth - 1, out),
            other => out.push(other.clone()),
        }
    }
}

/// Go `strings.Replace(s, old, new, n)`.
fn go_replace(s: &str, old: &str, new: &str, n: i64) -> String {
    if n < 0 {
        if old.is_empty() {
            let mut out = String::from(new);
            for c in s.chars() {
                out.push(c);
                out.push_str(new);
            }
            return out;
        }
        return s.replace(old, new);
    }
    if old.is_empty() {
        let mut out = String::new();
        let mut count = 0;
        if count < n {
            out.push_str(new);
            count += 1;
        }
        for c in s.chars() {
            out.push(c);
            if count < n {
                out.push_str(new);
                count += 1;
            }
        }
        return out;
    }
    s.replacen(old, new, n as usize)
}

/// Go `strings.SplitN(s, sep, n)`.
fn go_split_n(s: &str, sep: &str, n: i64) -> Vec<String> {
    if n == 0 {
        return Vec::new();
    }
    if sep.is_empty() {
        let chars: Vec<String> = s.chars().map(String::from).collect();
        if n < 0 || n as usize >= chars.len() {
            return chars;
        }
        let mut out: Vec<String> = chars[..n as usize - 1].to_vec();
        out.push(chars[n as usize - 1..].concat());
        return out;
    }
    if n < 0 {
        return s.split(sep).map(String::from).collect();
    }
    s.splitn(n as usize, sep).map(String::from).collect()
}

/// Evaluates a node. Recursion depth is bounded by the checker's nesting limit.
pub fn eval(node: &Node, ctx: &mut Ctx<'_>) -> R {
    match node {
        Node::Const(v) => Ok(v.clone()),
        Node::Local(slot) => {
            ctx.charge(1)?;
            ctx.locals[*slot].clone()
        }
        Node::Device => {
            ctx.charge(1)?;
            Ok(Value::Device)
        }
        Node::DeviceLookup { of, domain, name } => {
            ctx.charge(4)?;
            match ctx.device.domain(*of, domain).and_then(|m| m.get_str(name)) {
                Some(v) => Ok(v.clone()),
                None => err(format!("no such key: {name}")),
            }
        }
        Node::Select { operand, field } => {
            let v = eval(operand, ctx)?;
            ctx.charge(1)?;
            select_field(&v, field, ctx.device)
        }
        Node::Presence { operand, field } => {
            let v = eval(operand, ctx)?;
            has_field(&v, field, ctx.device)
        }
        Node::And(a, b) => {
            let left = eval(a, ctx);
            if let Ok(Value::Bool(false)) = left {
                return Ok(Value::Bool(false));
            }
            if let Err(e) = &left
                && e.abort
            {
                return left;
            }
            let right = eval(b, ctx);
            logic(left, right, false)
        }
        Node::Or(a, b) => {
            let left = eval(a, ctx);
            if let Ok(Value::Bool(true)) = left {
                return Ok(Value::Bool(true));
            }
            if let Err(e) = &left
                && e.abort
            {
                return left;
            }
            let right = eval(b, ctx);
            logic(left, right, true)
        }
        Node::Cond(c, t, f) => match eval(c, ctx)? {
            Value::Bool(true) => eval(t, ctx),
            Value::Bool(false) => eval(f, ctx),
            _ => no_such_overload(),
        },
        Node::NotStrictlyFalse(inner) => match eval(inner, ctx) {
            Ok(Value::Bool(b)) => Ok(Value::Bool(b)),
            Err(e) if e.abort => Err(e),
            _ => Ok(Value::Bool(true)),
        },
        Node::Call { func, args } => {
            // `or`/`orValue` short-circuit: the alternative is only evaluated when needed.
            if matches!(func, Func::OptOr | Func::OptOrValue) && args.len() == 2 {
                let target = eval(&args[0], ctx)?;
                ctx.charge(1)?;
                return match &target {
                    Value::Optional(Some(v)) => {
                        if *func == Func::OptOr {
                            Ok(target.clone())
                        } else {
                            Ok((**v).clone())
                        }
                    }
                    Value::Optional(None) => eval(&args[1], ctx),
                    _ => no_such_overload(),
                };
            }
            let mut values = Vec::with_capacity(args.len());
            for a in args {
                match eval(a, ctx) {
                    Ok(v) => values.push(v),
                    // cel-go's `distinct` is not strict: an error receiver panics inside it,
                    // which fails the whole evaluation.
                    Err(e) if matches!(func, Func::Distinct | Func::SortTracked) && !e.abort => {
                        return Err(EvalError {
                            message: Arc::from(
                                "internal error: interface conversion: *types.Err is not traits.Lister: missing method Add",
                            ),
                            abort: true,
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
            let result = call(*func, &values, ctx.device)?;
            ctx.charge(call_cost(*func, &values, &result))?;
            Ok(result)
        }
        Node::List { elems, optional } => {
            let mut out = Vec::with_capacity(elems.len());
            for (e, opt) in elems.iter().zip(optional) {
                let v = eval(e, ctx)?;
                if *opt {
                    match v {
                        Value::Optional(Some(inner)) => out.push((*inner).clone()),
                        Value::Optional(None) => {}
                        _ => return no_such_overload(),
                    }
                } else {
                    out.push(v);
                }
            }
            ctx.charge(10)?;
            Ok(list_value(out))
        }
        Node::Map { entries } => {
            let mut out: Vec<(Value, Value)> = Vec::with_capacity(entries.len());
            for (k, v, opt) in entries {
                let key = eval(k, ctx)?;
                if !matches!(
                    key,
                    Value::String(_)
                        | Value::Int(_)
                        | Value::Uint(_)
                        | Value::Bool(_)
                        | Value::Duration(_)
                        | Value::Timestamp(_)
                ) {
                    return err(format!("unsupported key type: {}", key.type_name()));
                }
                let val = eval(v, ctx)?;
                let val = if *opt {
                    match val {
                        Value::Optional(Some(inner)) => (*inner).clone(),
                        Value::Optional(None) => continue,
                        _ => return no_such_overload(),
                    }
                } else {
                    val
                };
                if let Some(slot) = out
                    .iter_mut()
                    .find(|(k2, _)| super::value::same_literal_key(k2, &key))
                {
                    slot.1 = val;
                } else {
                    out.push((key, val));
                }
            }
            ctx.charge(30)?;
            Ok(Value::Map(Arc::new(MapValue { entries: out })))
        }
        Node::Comprehension(c) => comprehension(c, ctx),
        Node::Bind { slot, init, body } => {
            let v = eval(init, ctx);
            if let Err(e) = &v
                && e.abort
            {
                return v;
            }
            ctx.locals[*slot] = v;
            eval(body, ctx)
        }
        Node::SortBy { target, slot, key } => {
            let t = eval(target, ctx)?;
            let Value::List(items) = &t else {
                return overload_error("sortBy", std::slice::from_ref(&t));
            };
            let mut keyed = Vec::with_capacity(items.len());
            for item in items.iter() {
                ctx.locals[*slot] = Ok(item.clone());
                keyed.push((eval(key, ctx)?, item.clone()));
            }
            let keys: Vec<Value> = keyed.iter().map(|(k, _)| k.clone()).collect();
            let mut failure = None;
            keyed.sort_by(|a, b| {
                match ordering_for_list(&a.0, &b.0, "@sortByAssociatedKeys", &keys) {
                    Ok(o) => o,
                    Err(e) => {
                        failure.get_or_insert(e);
                        Ordering::Equal
                    }
                }
            });
            match failure {
                Some(e) => Err(e),
                None => Ok(list_value(keyed.into_iter().map(|(_, v)| v).collect())),
            }
        }
        Node::OptMap {
            target,
            slot,
            body,
            flat,
        } => {
            let t = eval(target, ctx)?;
            match t {
                Value::Optional(None) => Ok(Value::Optional(None)),
                Value::Optional(Some(v)) => {
                    ctx.locals[*slot] = Ok((*v).clone());
                    let r = eval(body, ctx)?;
                    if *flat {
                        match r {
                            Value::Optional(_) => Ok(r),
                            _ => no_such_overload(),
                        }
                    } else {
                        Ok(Value::Optional(Some(Arc::new(r))))
                    }
                }
                _ => no_such_overload(),
            }
        }
    }
}

/// cel-go's `&&`/`||` with error absorption in both orders.
fn logic(left: R, right: R, is_or: bool) -> R {
    if let Ok(Value::Bool(b)) = &right
        && *b == is_or
    {
        return Ok(Value::Bool(is_or));
    }
    if let Err(e) = &right
        && e.abort
    {
        return right;
    }
    // The first term that is not a bool decides the error (cel-go evalOr/evalAnd).
    for term in [left, right] {
        match term {
            Ok(Value::Bool(_)) => {}
            Ok(_) => return no_such_overload(),
            Err(e) => return Err(e),
        }
    }
    Ok(Value::Bool(!is_or))
}

fn comprehension(c: &Comprehension, ctx: &mut Ctx<'_>) -> R {
    let range = eval(&c.range, ctx)?;
    let range = materialize(&range, ctx.device);
    let items: Vec<(Value, Value)> = match &range {
        Value::List(l) => l
            .iter()
            .enumerate()
            .map(|(i, v)| (Value::Int(i as i64), v.clone()))
            .collect(),
        Value::Map(m) => m
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        other => {
            return err(format!(
                "got '{}', expected iterable type",
                other.go_type_name()
            ));
        }
    };
    let accu = eval(&c.init, ctx);
    if let Err(e) = &accu
        && e.abort
    {
        return accu;
    }
    ctx.locals[c.accu_slot] = accu;
    let is_list = matches!(range, Value::List(_));
    for (key, value) in items {
        match c.iter2_slot {
            Some(slot2) => {
                ctx.locals[c.iter_slot] = Ok(key);
                ctx.locals[slot2] = Ok(value);
            }
            None => {
                ctx.locals[c.iter_slot] = Ok(if is_list { value } else { key });
            }
        }
        match eval(&c.cond, ctx) {
            Ok(Value::Bool(false)) => break,
            Ok(Value::Bool(true)) => {}
            Err(e) if e.abort => return Err(e),
            Err(e) => return Err(e),
            Ok(_) => return no_such_overload(),
        }
        let step = eval(&c.step, ctx);
        if let Err(e) = &step
            && e.abort
        {
            return step;
        }
        ctx.locals[c.accu_slot] = step;
    }
    eval(&c.result, ctx)
}
