//! Runtime values of the evaluator.
use std::cmp::Ordering;
use std::sync::Arc;

use k8s_quantity::Quantity;

use super::semver::Semver;

/// Which of the device's two domain maps a value stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainsOf {
    Attributes,
    Capacity,
}

#[derive(Debug, Clone)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(Arc<str>),
    Bytes(Arc<[u8]>),
    List(Arc<Vec<Value>>),
    Map(Arc<MapValue>),
    Quantity(Arc<Quantity>),
    Semver(Arc<Semver>),
    Ip(Arc<super::net::Addr>),
    Cidr(Arc<super::net::Prefix>),
    Url(Arc<super::url::Url>),
    /// `google.protobuf.Duration`, in nanoseconds (Go's `time.Duration`).
    Duration(i64),
    Timestamp(super::time::Timestamp),
    /// A named format (`format.dns1123Label()`), by index into `format::NAMES`.
    Format(u8),
    Optional(Option<Arc<Value>>),
    /// A type value (`type(x)`, `int`): its CEL type name.
    Type(Arc<str>),
    /// The `device` variable of the current evaluation.
    Device,
    /// `device.attributes` / `device.capacity`: looking up a missing domain gives an empty map.
    Domains(DomainsOf),
}

/// A map with insertion order kept (cel-go iterates map literals in that order).
#[derive(Debug, Default)]
pub struct MapValue {
    pub entries: Vec<(Value, Value)>,
}

impl MapValue {
    pub fn get(&self, key: &Value) -> Option<&Value> {
        // String keys are by far the most common; compare them without the generic path.
        if let Value::String(k) = key {
            return self
                .entries
                .iter()
                .find(|(ek, _)| matches!(ek, Value::String(s) if **s == **k))
                .map(|(_, v)| v);
        }
        self.entries
            .iter()
            .find(|(ek, _)| key_equal(ek, key))
            .map(|(_, v)| v)
    }

    pub fn get_str(&self, key: &str) -> Option<&Value> {
        self.entries
            .iter()
            .find(|(ek, _)| matches!(ek, Value::String(s) if &**s == key))
            .map(|(_, v)| v)
    }

    pub fn contains(&self, key: &Value) -> bool {
        self.get(key).is_some()
    }
}

/// Whether two keys of a map literal are the same entry (the later one replaces the earlier).
pub fn same_literal_key(a: &Value, b: &Value) -> bool {
    match (a, b) {
        // Go map keys: a timestamp's location is part of it.
        (Value::Timestamp(x), Value::Timestamp(y)) => x.same_key(y),
        _ => matches!(a.equals(b), Equality::Equal(true)),
    }
}

/// Map-key equality: numeric keys compare across int/uint/double as cel-go does.
fn key_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        // Go map keys compare by value: a timestamp's zone is part of it.
        (Value::Duration(x), Value::Duration(y)) => x == y,
        (Value::Timestamp(x), Value::Timestamp(y)) => x.same_key(y),
        _ => numeric_cmp(a, b) == Some(Ordering::Equal),
    }
}

/// Ordering across int, uint and double (cel-go cross-type numeric comparison).
pub fn numeric_cmp(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::Uint(x), Value::Uint(y)) => Some(x.cmp(y)),
        (Value::Double(x), Value::Double(y)) => x.partial_cmp(y),
        (Value::Int(x), Value::Uint(y)) => Some(if *x < 0 {
            Ordering::Less
        } else {
            (*x as u64).cmp(y)
        }),
        (Value::Uint(x), Value::Int(y)) => Some(if *y < 0 {
            Ordering::Greater
        } else {
            x.cmp(&(*y as u64))
        }),
        (Value::Int(x), Value::Double(y)) => int_double_cmp(*x, *y),
        (Value::Double(x), Value::Int(y)) => int_double_cmp(*y, *x).map(Ordering::reverse),
        (Value::Uint(x), Value::Double(y)) => uint_double_cmp(*x, *y),
        (Value::Double(x), Value::Uint(y)) => uint_double_cmp(*y, *x).map(Ordering::reverse),
        _ => None,
    }
}

/// cel-go `compareIntDouble`: range checks first, then compare as doubles.
fn int_double_cmp(i: i64, d: f64) -> Option<Ordering> {
    if d.is_nan() {
        return None;
    }
    if d < -9.223_372_036_854_776e18 {
        return Some(Ordering::Greater);
    }
    if d >= 9.223_372_036_854_776e18 {
        return Some(Ordering::Less);
    }
    (i as f64).partial_cmp(&d)
}

fn uint_double_cmp(u: u64, d: f64) -> Option<Ordering> {
    if d.is_nan() {
        return None;
    }
    if d < 0.0 {
        return Some(Ordering::Greater);
    }
    if d >= 1.844_674_407_370_955_2e19 {
        return Some(Ordering::Less);
    }
    (u as f64).partial_cmp(&d)
}

/// Outcome of cel-go `Equal` before it is turned into a value or an error.
pub enum Equality {
    Equal(bool),
    /// A Kubernetes type compared with something it does not accept: "no such overload".
    NoSuchOverload,
}

impl Value {
    /// cel-go's type name as `type(x)` and error messages print it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null_type",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Uint(_) => "uint",
            Value::Double(_) => "double",
            Value::String(_) => "string",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Map(_) | Value::Domains(_) => "map",
            Value::Quantity(_) => "kubernetes.Quantity",
            Value::Semver(_) => "kubernetes.Semver",
            Value::Ip(_) => "net.IP",
            Value::Cidr(_) => "net.CIDR",
            Value::Format(_) => "kubernetes.NamedFormat",
            Value::Url(_) => "kubernetes.URL",
            Value::Duration(_) => "google.protobuf.Duration",
            Value::Timestamp(_) => "google.protobuf.Timestamp",
            Value::Optional(_) => "optional_type",
            Value::Type(_) => "type",
            Value::Device => "map",
        }
    }

    /// The Go type name cel-go prints in "got 'types.X', expected iterable type".
    pub fn go_type_name(&self) -> &'static str {
        match self {
            Value::Null => "types.Null",
            Value::Bool(_) => "types.Bool",
            Value::Int(_) => "types.Int",
            Value::Uint(_) => "types.Uint",
            Value::Double(_) => "types.Double",
            Value::String(_) => "types.String",
            Value::Bytes(_) => "types.Bytes",
            Value::List(_) => "*types.baseList",
            Value::Map(_) | Value::Domains(_) | Value::Device => "*types.baseMap",
            Value::Quantity(q) => {
                if q.is_arithmetic_result() {
                    "*cel.Quantity"
                } else {
                    "cel.Quantity"
                }
            }
            Value::Semver(_) => "cel.Semver",
            Value::Ip(_) => "cel.IP",
            Value::Cidr(_) => "cel.CIDR",
            Value::Format(_) => "cel.Format",
            Value::Url(_) => "cel.URL",
            Value::Duration(_) => "types.Duration",
            Value::Timestamp(_) => "types.Timestamp",
            Value::Optional(_) => "*types.Optional",
            Value::Type(_) => "*types.Type",
        }
    }

    pub fn string(s: &str) -> Value {
        Value::String(Arc::from(s))
    }

    /// cel-go `types.Equal(lhs, rhs)`.
    pub fn equals(&self, other: &Value) -> Equality {
        use Value::*;
        let eq = match (self, other) {
            (Null, Null) => true,
            (Null, _) | (_, Null) => false,
            (Quantity(a), Quantity(b)) => {
                if b.is_arithmetic_result() {
                    return Equality::NoSuchOverload;
                }
                a.cmp_value(b) == Ordering::Equal
            }
            (Quantity(_), _) => return Equality::NoSuchOverload,
            (Semver(a), Semver(b)) => a.compare(b) == Ordering::Equal,
            (Semver(_), _) => return Equality::NoSuchOverload,
            (Ip(a), Ip(b)) => a == b,
            (Cidr(a), Cidr(b)) => a == b,
            (Format(a), Format(b)) => a == b,
            // Kubernetes compares URLs by their Go `String()` form.
            (Url(a), Url(b)) => a.to_go_string() == b.to_go_string(),
            (Ip(_) | Cidr(_) | Format(_) | Url(_), _) => return Equality::NoSuchOverload,
            (Bool(a), Bool(b)) => a == b,
            (Duration(a), Duration(b)) => a == b,
            (Timestamp(a), Timestamp(b)) => a.same_instant(b),
            (String(a), String(b)) => a == b,
            (Bytes(a), Bytes(b)) => a == b,
            (Int(_) | Uint(_) | Double(_), Int(_) | Uint(_) | Double(_)) => {
                numeric_cmp(self, other) == Some(Ordering::Equal)
            }
            (List(a), List(b)) => {
                if a.len() != b.len() {
                    return Equality::Equal(false);
                }
                // cel-go only stops on a definite `false`; element errors are skipped.
                for (x, y) in a.iter().zip(b.iter()) {
                    if let Equality::Equal(false) = x.equals(y) {
                        return Equality::Equal(false);
                    }
                }
                true
            }
            (Map(a), Map(b)) => return map_equals(&a.entries, b),
            (Optional(a), Optional(b)) => match (a, b) {
                (None, None) => true,
                (Some(x), Some(y)) => return x.equals(y),
                _ => false,
            },
            (Type(a), Type(b)) => a == b,
            (Device, Device) => true,
            (Domains(a), Domains(b)) => a == b,
            _ => false,
        };
        Equality::Equal(eq)
    }
}

fn map_equals(a: &[(Value, Value)], b: &MapValue) -> Equality {
    if a.len() != b.entries.len() {
        return Equality::Equal(false);
    }
    for (k, v) in a {
        match b.get(k) {
            None => return Equality::Equal(false),
            Some(other) => {
                if let Equality::Equal(false) = v.equals(other) {
                    return Equality::Equal(false);
                }
            }
        }
    }
    Equality::Equal(true)
}
