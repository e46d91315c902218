//! Static CEL types for the checker, formatted exactly as cel-go prints them in errors.
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
            Type::Duration => f.write_str("google.protobuf.Duration"),
            Type::Timestamp => f.write_str("google.protobuf.Timestamp"),
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
        }
    }
}

/// Type-parameter bindings collected while matching one overload.
#[derive(Default, Clone)]
pub struct Bindings {
    params: [Option<Type>; 4],
}

impl Bindings {
    /// Whether `actual` can be passed where `pattern` is expected, binding parameters.
    pub fn unify(&mut self, pattern: &Type, actual: &Type) -> bool {
        if actual.is_dyn_like() && !matches!(pattern, Type::Param(_)) {
            return true;
        }
        match (pattern, actual) {
            (Type::Dyn, _) => true,
            // null is assignable to the well-known message types.
            (Type::Timestamp | Type::Duration, Type::Null) => true,
            (Type::Param(p), _) => {
                let slot = &mut self.params[*p as usize];
                match slot {
                    None => {
                        *slot = Some(actual.clone());
                        true
                    }
                    Some(bound) => {
                        let bound = bound.clone();
                        if let Some(joined) = join(&bound, actual) {
                            self.params[*p as usize] = Some(joined);
                            true
                        } else {
                            false
                        }
                    }
                }
            }
            (Type::List(p), Type::List(a)) => self.unify(p, a),
            (Type::Optional(p), Type::Optional(a)) => self.unify(p, a),
            (Type::TypeOf(p), Type::TypeOf(a)) => {
                // Type values of different types are still comparable.
                let _ = self.unify(p, a);
                true
            }
            (Type::Map(pk, pv), Type::Map(ak, av)) => self.unify(pk, ak) && self.unify(pv, av),
            (p, a) => p == a,
        }
    }

    /// Replaces bound parameters; unbound ones become `dyn`.
    pub fn substitute(&self, t: &Type) -> Type {
        match t {
            Type::Param(p) => self.params[*p as usize].clone().unwrap_or(Type::Dyn),
            Type::List(e) => Type::list(self.substitute(e)),
            Type::Optional(e) => Type::optional(self.substitute(e)),
            Type::TypeOf(e) => Type::TypeOf(Arc::new(self.substitute(e))),
            Type::Map(k, v) => Type::map(self.substitute(k), self.substitute(v)),
            other => other.clone(),
        }
    }
}

/// The common type of two types if they are compatible (dyn absorbs), else None.
pub fn join(a: &Type, b: &Type) -> Option<Type> {
    // cel-go's `mostGeneral`: dyn wins; an already-failed expression takes the other type.
    if matches!(a, Type::Error) {
        return Some(b.clone());
    }
    if matches!(b, Type::Error) || matches!(a, Type::Dyn) {
        return Some(a.clone());
    }
    if matches!(b, Type::Dyn) {
        return Some(Type::Dyn);
    }
    match (a, b) {
        (Type::List(x), Type::List(y)) => join(x, y).map(Type::list),
        (Type::Optional(x), Type::Optional(y)) => join(x, y).map(Type::optional),
        (Type::TypeOf(x), Type::TypeOf(y)) => {
            Some(Type::TypeOf(Arc::new(join(x, y).unwrap_or(Type::Dyn))))
        }
        (Type::Map(ak, av), Type::Map(bk, bv)) => Some(Type::map(join(ak, bk)?, join(av, bv)?)),
        (x, y) if x == y => Some(x.clone()),
        _ => None,
    }
}
