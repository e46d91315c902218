//! Static CEL types for the checker, formatted exactly as cel-go prints them in errors.
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    Dyn,
    /// The error type: an expression that already failed to check.
    Error,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    List(Arc<Type>),
    Map(Arc<Type>, Arc<Type>),
    Optional(Arc<Type>),
    /// A type value, e.g. the result of `type(x)` or the identifier `int`.
    #[allow(clippy::enum_variant_names)] // cel-go's name for it: a value of type `type(T)`.
    TypeOf(Arc<Type>),
    Quantity,
    Semver,
    Ip,
    Cidr,
    Format,
    Url,
    Device,
    /// A type parameter in an overload signature (A, B, ...).
    Param(u8),
    /// A free type variable of the checker (cel-go's `_varN`).
    Var(u32),
}

impl Type {
    pub fn list(elem: Type) -> Type {
        Type::List(Arc::new(elem))
    }
    pub fn map(key: Type, value: Type) -> Type {
        Type::Map(Arc::new(key), Arc::new(value))
    }
    pub fn optional(inner: Type) -> Type {
        Type::Optional(Arc::new(inner))
    }
    pub fn is_dyn_like(&self) -> bool {
        matches!(self, Type::Dyn | Type::Error)
    }
}

impl Type {
    /// cel-go's `Type.String()`: like the checker's spelling, but the well-known types by their
    /// full names (`type(google.protobuf.Timestamp)`).
    pub fn full_name(&self) -> String {
        match self {
            Type::Duration => "google.protobuf.Duration".into(),
            Type::Timestamp => "google.protobuf.Timestamp".into(),
            Type::List(e) => format!("list({})", e.full_name()),
            Type::Map(k, v) => format!("map({}, {})", k.full_name(), v.full_name()),
            Type::Optional(t) => format!("optional_type({})", t.full_name()),
            Type::TypeOf(t) => format!("type({})", t.full_name()),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Dyn => f.write_str("dyn"),
            Type::Error => f.write_str("*error*"),
            Type::Null => f.write_str("null"),
            Type::Bool => f.write_str("bool"),
            Type::Int => f.write_str("int"),
            Type::Uint => f.write_str("uint"),
            Type::Double => f.write_str("double"),
            Type::String => f.write_str("string"),
            Type::Bytes => f.write_str("bytes"),
            // cel-go's FormatCELType spells the well-known types short.
            Type::Duration => f.write_str("duration"),
            Type::Timestamp => f.write_str("timestamp"),
            Type::List(e) => write!(f, "list({e})"),
            Type::Map(k, v) => write!(f, "map({k}, {v})"),
            Type::Optional(t) => write!(f, "optional_type({t})"),
            Type::TypeOf(t) => write!(f, "type({t})"),
            Type::Quantity => f.write_str("kubernetes.Quantity"),
            Type::Semver => f.write_str("kubernetes.Semver"),
            Type::Ip => f.write_str("net.IP"),
            Type::Cidr => f.write_str("net.CIDR"),
            Type::Format => f.write_str("kubernetes.NamedFormat"),
            Type::Url => f.write_str("kubernetes.URL"),
            Type::Device => f.write_str("kubernetes.DRADevice"),
            Type::Param(p) => write!(f, "{}", (b'A' + p) as char),
            Type::Var(v) => write!(f, "_var{v}"),
        }
    }
}

/// Type substitutions of the checker's free type variables (cel-go's `mapping`).
pub type Subst = HashMap<u32, Type>;

/// cel-go's `substitute`: replaces bound type variables; unbound ones become `dyn` when
/// `to_dyn` (the checker's final types), else stay variables.
pub fn substitute(m: &Subst, t: &Type, to_dyn: bool) -> Type {
    match t {
        Type::Var(v) => match m.get(v) {
            Some(s) => substitute(m, s, to_dyn),
            None if to_dyn => Type::Dyn,
            None => t.clone(),
        },
        Type::List(e) => Type::list(substitute(m, e, to_dyn)),
        Type::Optional(e) => Type::optional(substitute(m, e, to_dyn)),
        Type::TypeOf(e) => Type::TypeOf(Arc::new(substitute(m, e, to_dyn))),
        Type::Map(k, v) => Type::map(substitute(m, k, to_dyn), substitute(m, v, to_dyn)),
        other => other.clone(),
    }
}

/// cel-go's `internalIsAssignable`: whether a value of type `t1` can be used where `t2` is
/// expected, binding free type variables in `m` (which the caller discards on failure).
pub fn assignable(m: &mut Subst, t1: &Type, t2: &Type) -> bool {
    if matches!(t2, Type::Var(_)) {
        let (valid, has_sub) = valid_substitution(m, t1, t2);
        if valid {
            return true;
        }
        if has_sub {
            return false;
        }
    }
    if matches!(t1, Type::Var(_)) {
        return valid_substitution(m, t2, t1).0;
    }
    if t1.is_dyn_like() || t2.is_dyn_like() {
        return true;
    }
    match (t1, t2) {
        // null is assignable to the well-known message types.
        (Type::Null, Type::Timestamp | Type::Duration)
        | (Type::Timestamp | Type::Duration, Type::Null) => true,
        (Type::List(a), Type::List(b)) | (Type::Optional(a), Type::Optional(b)) => {
            assignable(m, a, b)
        }
        (Type::Map(ak, av), Type::Map(bk, bv)) => assignable(m, ak, bk) && assignable(m, av, bv),
        // Type values of different types are still comparable.
        (Type::TypeOf(_), Type::TypeOf(_)) => true,
        (a, b) => a == b,
    }
}

/// cel-go's `isValidTypeSubstitution` for the type variable `t2`: (valid, t2 already bound).
fn valid_substitution(m: &mut Subst, t1: &Type, t2: &Type) -> (bool, bool) {
    if t1 == t2 {
        return (true, true);
    }
    let Type::Var(v) = t2 else {
        return (false, false);
    };
    if let Some(sub) = m.get(v).cloned() {
        if *t1 == sub {
            return (true, true);
        }
        if assignable(m, t1, &sub) {
            let general = most_general(t1, &sub);
            if not_referenced_in(m, t2, &general) {
                m.insert(*v, general);
            }
            return (true, true);
        }
        return (false, true);
    }
    if not_referenced_in(m, t2, t1) {
        m.insert(*v, t1.clone());
        return (true, false);
    }
    (false, false)
}

fn not_referenced_in(m: &Subst, t: &Type, within: &Type) -> bool {
    if t == within {
        return false;
    }
    match within {
        Type::Var(w) => match m.get(w) {
            None => true,
            Some(sub) => not_referenced_in(m, t, sub),
        },
        Type::List(e) | Type::Optional(e) | Type::TypeOf(e) => not_referenced_in(m, t, e),
        Type::Map(k, v) => not_referenced_in(m, t, k) && not_referenced_in(m, t, v),
        _ => true,
    }
}

/// cel-go's `isEqualOrLessSpecific`.
fn less_specific(t1: &Type, t2: &Type) -> bool {
    if matches!(t1, Type::Dyn | Type::Var(_)) {
        return true;
    }
    if matches!(t2, Type::Dyn | Type::Var(_)) {
        return false;
    }
    match (t1, t2) {
        (Type::List(a), Type::List(b)) | (Type::Optional(a), Type::Optional(b)) => {
            less_specific(a, b)
        }
        (Type::Map(ak, av), Type::Map(bk, bv)) => less_specific(ak, bk) && less_specific(av, bv),
        (Type::TypeOf(_), Type::TypeOf(_)) => true,
        (a, b) => a == b,
    }
}

/// cel-go's `mostGeneral`.
pub fn most_general(t1: &Type, t2: &Type) -> Type {
    if less_specific(t1, t2) {
        t1.clone()
    } else {
        t2.clone()
    }
}
