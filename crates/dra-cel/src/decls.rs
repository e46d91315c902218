//! Function declarations of the DRA environment: overload signatures for the checker and the
//! runtime function each name dispatches to.
use std::collections::HashMap;
use std::sync::LazyLock;

use super::time::TimeField;
use super::types::Type;

/// Runtime functions. One variant per CEL function name; overloads dispatch on values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Func {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Neg,
    Not,
    In,
    Index,
    Size,
    Contains,
    StartsWith,
    EndsWith,
    Matches,
    ToInt,
    ToUint,
    ToDouble,
    ToString,
    ToBool,
    ToBytes,
    ToDyn,
    TypeOf,
    Quantity,
    IsQuantity,
    Sign,
    IsGreaterThan,
    IsLessThan,
    CompareTo,
    QuantityAdd,
    QuantitySub,
    AsInteger,
    AsApproximateFloat,
    IsInteger,
    Semver,
    IsSemver,
    Major,
    Minor,
    Patch,
    CharAt,
    IndexOf,
    LastIndexOf,
    LowerAscii,
    UpperAscii,
    Replace,
    Split,
    Substring,
    Trim,
    Join,
    Quote,
    Find,
    FindAll,
    IsSorted,
    Sum,
    /// `sum()` of a list statically typed `list(google.protobuf.Duration)`: its empty sum is a
    /// zero duration (Kubernetes' typed overload), not 0.
    SumDurations,
    Min,
    Max,
    Includes,
    ListsRange,
    Slice,
    Flatten,
    Distinct,
    Reverse,
    Sort,
    /// `sort()` of a list whose element type picks one typed overload: cel-go's cost tracker for
    /// it reads the receiver as a list even when it is an error, and panics.
    SortTracked,
    First,
    Last,
    SetsContains,
    SetsEquivalent,
    SetsIntersects,
    OptionalOf,
    OptionalNone,
    OptionalOfNonZeroValue,
    HasValue,
    OptValue,
    OptOr,
    OptOrValue,
    OptSelect,
    OptIndex,
    OptionalUnwrap,
    /// Internal: insert into a map (two-variable `transformMap`).
    MapInsert,
    /// Internal: merge a map into the accumulator (`transformMapEntry`).
    MapMerge,
    Ip,
    IsIp,
    IpIsCanonical,
    Family,
    IsUnspecified,
    IsLoopback,
    IsLinkLocalMulticast,
    IsLinkLocalUnicast,
    IsGlobalUnicast,
    Cidr,
    IsCidr,
    ContainsIp,
    ContainsCidr,
    PrefixLength,
    Masked,
    /// `format.<name>()`, by index into `format::NAMES`.
    FormatConst(u8),
    FormatNamed,
    FormatValidate,
    Url,
    IsUrl,
    GetScheme,
    GetHost,
    GetHostname,
    GetPort,
    GetEscapedPath,
    GetQuery,
    StringFormat,
    /// `duration(x)` and `timestamp(x)` conversions.
    ToDuration,
    ToTimestamp,
    /// Timestamp and duration accessors (`getHours()`, `getFullYear(tz)` ...).
    TimeGet(TimeField),
}

pub struct Sig {
    pub member: bool,
    pub params: Vec<Type>,
    pub result: Type,
}

pub struct FuncDecl {
    pub func: Func,
    pub sigs: Vec<Sig>,
}

const A: Type = Type::Param(0);
const B: Type = Type::Param(1);

fn g(params: &[Type], result: Type) -> Sig {
    Sig {
        member: false,
        params: params.to_vec(),
        result,
    }
}
fn m(params: &[Type], result: Type) -> Sig {
    Sig {
        member: true,
        params: params.to_vec(),
        result,
    }
}

fn list(t: Type) -> Type {
    Type::list(t)
}

/// All functions of the environment, keyed by CEL name (qualified names such as
/// `optional.of` included).
pub static DECLS: LazyLock<HashMap<&'static str, FuncDecl>> = LazyLock::new(build);

fn build() -> HashMap<&'static str, FuncDecl> {
    use Type::{Bool, Bytes, Double, Dyn, Int, Quantity as Q, Semver as S, String as Str, Uint};
    let mut d: HashMap<&'static str, FuncDecl> = HashMap::new();
    let mut add = |name: &'static str, func: Func, sigs: Vec<Sig>| {
        d.insert(name, FuncDecl { func, sigs });
    };
    let map_ab = Type::map(A, B);

    add("_==_", Func::Eq, vec![g(&[A, A], Bool)]);
    add("_!=_", Func::Ne, vec![g(&[A, A], Bool)]);
    let mut ordering = Vec::new();
    for t in [
        Int,
        Uint,
        Double,
        Str,
        Bytes,
        Bool,
        Type::Timestamp,
        Type::Duration,
    ] {
        ordering.push(g(&[t.clone(), t], Bool));
    }
    for (a, b) in [
        (Int, Uint),
        (Int, Double),
        (Uint, Int),
        (Uint, Double),
        (Double, Int),
        (Double, Uint),
    ] {
        ordering.push(g(&[a, b], Bool));
    }
    let ordering2 = || {
        ordering
            .iter()
            .map(|s| g(&s.params, Bool))
            .collect::<Vec<_>>()
    };
    add("_<_", Func::Lt, ordering2());
    add("_<=_", Func::Le, ordering2());
    add("_>_", Func::Gt, ordering2());
    add("_>=_", Func::Ge, ordering2());
    add(
        "_+_",
        Func::Add,
        // cel-go's overload order: the first match binds free type variables.
        vec![
            g(&[Bytes, Bytes], Bytes),
            g(&[Double, Double], Double),
            g(&[Type::Duration, Type::Duration], Type::Duration),
            g(&[Type::Duration, Type::Timestamp], Type::Timestamp),
            g(&[Type::Timestamp, Type::Duration], Type::Timestamp),
            g(&[Int, Int], Int),
            g(&[list(A), list(A)], list(A)),
            g(&[Str, Str], Str),
            g(&[Uint, Uint], Uint),
        ],
    );
    let arith = |extra: bool| {
        let mut v = Vec::new();
        if extra {
            v.push(g(&[Double, Double], Double));
        }
        v.push(g(&[Int, Int], Int));
        v.push(g(&[Uint, Uint], Uint));
        v
    };
    let sub = vec![
        g(&[Double, Double], Double),
        g(&[Type::Duration, Type::Duration], Type::Duration),
        g(&[Int, Int], Int),
        g(&[Type::Timestamp, Type::Duration], Type::Timestamp),
        g(&[Type::Timestamp, Type::Timestamp], Type::Duration),
        g(&[Uint, Uint], Uint),
    ];
    add("_-_", Func::Sub, sub);
    add("_*_", Func::Mul, arith(true));
    add("_/_", Func::Div, arith(true));
    add("_%_", Func::Mod, arith(false));
    add("-_", Func::Neg, vec![g(&[Double], Double), g(&[Int], Int)]);
    add("!_", Func::Not, vec![g(&[Bool], Bool)]);
    add("_&&_", Func::Not, vec![g(&[Bool, Bool], Bool)]);
    add("_||_", Func::Not, vec![g(&[Bool, Bool], Bool)]);
    add("_?_:_", Func::Not, vec![g(&[Bool, A, A], A)]);
    add("@not_strictly_false", Func::Not, vec![g(&[Bool], Bool)]);
    add(
        "@in",
        Func::In,
        vec![g(&[A, list(A)], Bool), g(&[A, map_ab.clone()], Bool)],
    );
    add(
        "_[_]",
        Func::Index,
        vec![g(&[list(A), Int], A), g(&[map_ab.clone(), A], B)],
    );
    add(
        "_[?_]",
        Func::OptIndex,
        vec![
            g(&[list(A), Int], Type::optional(A)),
            g(&[map_ab.clone(), A], Type::optional(B)),
            g(&[Type::optional(list(A)), Int], Type::optional(A)),
            g(&[Type::optional(map_ab.clone()), A], Type::optional(B)),
        ],
    );
    let sized = [Str, Bytes, list(A), map_ab.clone()];
    add(
        "size",
        Func::Size,
        sized
            .iter()
            .map(|t| g(std::slice::from_ref(t), Int))
            .chain(sized.iter().map(|t| m(std::slice::from_ref(t), Int)))
            .collect(),
    );
    add("contains", Func::Contains, vec![m(&[Str, Str], Bool)]);
    add("startsWith", Func::StartsWith, vec![m(&[Str, Str], Bool)]);
    add("endsWith", Func::EndsWith, vec![m(&[Str, Str], Bool)]);
    add(
        "matches",
        Func::Matches,
        vec![m(&[Str, Str], Bool), g(&[Str, Str], Bool)],
    );
    add(
        "int",
        Func::ToInt,
        vec![
            g(&[Int], Int),
            g(&[Uint], Int),
            g(&[Double], Int),
            g(&[Type::Duration], Int),
            g(&[Str], Int),
            g(&[Type::Timestamp], Int),
        ],
    );
    add(
        "uint",
        Func::ToUint,
        vec![
            g(&[Uint], Uint),
            g(&[Int], Uint),
            g(&[Double], Uint),
            g(&[Str], Uint),
        ],
    );
    add(
        "double",
        Func::ToDouble,
        vec![
            g(&[Double], Double),
            g(&[Int], Double),
            g(&[Uint], Double),
            g(&[Str], Double),
        ],
    );
    add(
        "string",
        Func::ToString,
        vec![
            g(&[Str], Str),
            g(&[Int], Str),
            g(&[Uint], Str),
            g(&[Double], Str),
            g(&[Bool], Str),
            g(&[Bytes], Str),
            g(&[Type::Duration], Str),
            g(&[Type::Timestamp], Str),
            g(&[Type::Ip], Str),
            g(&[Type::Cidr], Str),
        ],
    );
    add(
        "bool",
        Func::ToBool,
        vec![g(&[Bool], Bool), g(&[Str], Bool)],
    );
    add(
        "bytes",
        Func::ToBytes,
        vec![g(&[Bytes], Bytes), g(&[Str], Bytes)],
    );
    add("dyn", Func::ToDyn, vec![g(&[A], Dyn)]);
    let (dur, ts) = (Type::Duration, Type::Timestamp);
    add(
        "duration",
        Func::ToDuration,
        vec![
            g(std::slice::from_ref(&dur), dur.clone()),
            g(&[Str], dur.clone()),
        ],
    );
    add(
        "timestamp",
        Func::ToTimestamp,
        vec![
            g(std::slice::from_ref(&ts), ts.clone()),
            g(&[Int], ts.clone()),
            g(&[Str], ts.clone()),
        ],
    );
    for field in [
        TimeField::FullYear,
        TimeField::Month,
        TimeField::DayOfYear,
        TimeField::DayOfMonth,
        TimeField::Date,
        TimeField::DayOfWeek,
        TimeField::Hours,
        TimeField::Minutes,
        TimeField::Seconds,
        TimeField::Milliseconds,
    ] {
        let mut sigs = vec![
            m(std::slice::from_ref(&ts), Int),
            m(&[ts.clone(), Str], Int),
        ];
        if field.on_durations() {
            sigs.push(m(std::slice::from_ref(&dur), Int));
        }
        add(field.name(), Func::TimeGet(field), sigs);
    }
    add(
        "type",
        Func::TypeOf,
        vec![g(&[A], Type::TypeOf(std::sync::Arc::new(A)))],
    );

    // Kubernetes quantity library.
    add("quantity", Func::Quantity, vec![g(&[Str], Q)]);
    add("isQuantity", Func::IsQuantity, vec![g(&[Str], Bool)]);
    add("sign", Func::Sign, vec![g(&[Q], Int)]);
    add(
        "isGreaterThan",
        Func::IsGreaterThan,
        vec![m(&[Q, Q], Bool), m(&[S, S], Bool)],
    );
    add(
        "isLessThan",
        Func::IsLessThan,
        vec![m(&[Q, Q], Bool), m(&[S, S], Bool)],
    );
    add(
        "compareTo",
        Func::CompareTo,
        vec![m(&[Q, Q], Int), m(&[S, S], Int)],
    );
    add(
        "add",
        Func::QuantityAdd,
        vec![m(&[Q, Q], Q), m(&[Q, Int], Q)],
    );
    add(
        "sub",
        Func::QuantitySub,
        vec![m(&[Q, Q], Q), m(&[Q, Int], Q)],
    );
    add("asInteger", Func::AsInteger, vec![m(&[Q], Int)]);
    add(
        "asApproximateFloat",
        Func::AsApproximateFloat,
        vec![m(&[Q], Double)],
    );
    add("isInteger", Func::IsInteger, vec![m(&[Q], Bool)]);

    // Kubernetes semver library (v1).
    add(
        "semver",
        Func::Semver,
        vec![g(&[Str], S), g(&[Str, Bool], S)],
    );
    add(
        "isSemver",
        Func::IsSemver,
        vec![g(&[Str], Bool), g(&[Str, Bool], Bool)],
    );
    add("major", Func::Major, vec![m(&[S], Int)]);
    add("minor", Func::Minor, vec![m(&[S], Int)]);
    add("patch", Func::Patch, vec![m(&[S], Int)]);

    // cel-go strings extension v2 (plus lists' indexOf/lastIndexOf on lists).
    add("charAt", Func::CharAt, vec![m(&[Str, Int], Str)]);
    add(
        "indexOf",
        Func::IndexOf,
        vec![
            m(&[Str, Str], Int),
            m(&[Str, Str, Int], Int),
            m(&[list(A), A], Int),
        ],
    );
    add(
        "lastIndexOf",
        Func::LastIndexOf,
        vec![
            m(&[Str, Str], Int),
            m(&[Str, Str, Int], Int),
            m(&[list(A), A], Int),
        ],
    );
    add("lowerAscii", Func::LowerAscii, vec![m(&[Str], Str)]);
    add("upperAscii", Func::UpperAscii, vec![m(&[Str], Str)]);
    add(
        "replace",
        Func::Replace,
        vec![m(&[Str, Str, Str], Str), m(&[Str, Str, Str, Int], Str)],
    );
    add(
        "split",
        Func::Split,
        vec![m(&[Str, Str], list(Str)), m(&[Str, Str, Int], list(Str))],
    );
    add(
        "substring",
        Func::Substring,
        vec![m(&[Str, Int], Str), m(&[Str, Int, Int], Str)],
    );
    add("trim", Func::Trim, vec![m(&[Str], Str)]);
    add(
        "join",
        Func::Join,
        vec![m(&[list(Str)], Str), m(&[list(Str), Str], Str)],
    );
    add("strings.quote", Func::Quote, vec![g(&[Str], Str)]);

    // Kubernetes regex library.
    add("find", Func::Find, vec![m(&[Str, Str], Str)]);
    add(
        "findAll",
        Func::FindAll,
        vec![m(&[Str, Str], list(Str)), m(&[Str, Str, Int], list(Str))],
    );

    // Kubernetes lists library (v1 includes `includes`).
    add("isSorted", Func::IsSorted, vec![m(&[list(A)], Bool)]);
    add("sum", Func::Sum, vec![m(&[list(A)], A)]);
    add("min", Func::Min, vec![m(&[list(A)], A)]);
    add("max", Func::Max, vec![m(&[list(A)], A)]);
    add("includes", Func::Includes, vec![m(&[Dyn, Dyn], Bool)]);

    // cel-go lists extension v3.
    add("lists.range", Func::ListsRange, vec![g(&[Int], list(Int))]);
    add("slice", Func::Slice, vec![m(&[list(A), Int, Int], list(A))]);
    add(
        "flatten",
        Func::Flatten,
        vec![
            m(&[list(list(A))], list(A)),
            m(&[list(Dyn), Int], list(Dyn)),
        ],
    );
    add("distinct", Func::Distinct, vec![m(&[list(A)], list(A))]);
    add("reverse", Func::Reverse, vec![m(&[list(A)], list(A))]);
    add("sort", Func::Sort, vec![m(&[list(A)], list(A))]);

    // cel-go sets extension.
    add(
        "sets.contains",
        Func::SetsContains,
        vec![g(&[list(A), list(A)], Bool)],
    );
    add(
        "sets.equivalent",
        Func::SetsEquivalent,
        vec![g(&[list(A), list(A)], Bool)],
    );
    add(
        "sets.intersects",
        Func::SetsIntersects,
        vec![g(&[list(A), list(A)], Bool)],
    );

    // Kubernetes IP and CIDR libraries.
    let (ip, cidr) = (Type::Ip, Type::Cidr);
    add(
        "ip",
        Func::Ip,
        vec![
            g(&[Str], ip.clone()),
            m(std::slice::from_ref(&cidr), ip.clone()),
        ],
    );
    add("isIP", Func::IsIp, vec![g(&[Str], Bool)]);
    add("ip.isCanonical", Func::IpIsCanonical, vec![g(&[Str], Bool)]);
    add(
        "family",
        Func::Family,
        vec![m(std::slice::from_ref(&ip), Int)],
    );
    for (name, func) in [
        ("isUnspecified", Func::IsUnspecified),
        ("isLoopback", Func::IsLoopback),
        ("isLinkLocalMulticast", Func::IsLinkLocalMulticast),
        ("isLinkLocalUnicast", Func::IsLinkLocalUnicast),
        ("isGlobalUnicast", Func::IsGlobalUnicast),
    ] {
        add(name, func, vec![m(std::slice::from_ref(&ip), Bool)]);
    }
    add("cidr", Func::Cidr, vec![g(&[Str], cidr.clone())]);
    add("isCIDR", Func::IsCidr, vec![g(&[Str], Bool)]);
    add(
        "containsIP",
        Func::ContainsIp,
        vec![m(&[cidr.clone(), Str], Bool), m(&[cidr.clone(), ip], Bool)],
    );
    add(
        "containsCIDR",
        Func::ContainsCidr,
        vec![
            m(&[cidr.clone(), Str], Bool),
            m(&[cidr.clone(), cidr.clone()], Bool),
        ],
    );
    add(
        "prefixLength",
        Func::PrefixLength,
        vec![m(std::slice::from_ref(&cidr), Int)],
    );
    add(
        "masked",
        Func::Masked,
        vec![m(std::slice::from_ref(&cidr), cidr.clone())],
    );

    add(
        "format",
        Func::StringFormat,
        vec![m(&[Str, list(Dyn)], Str)],
    );

    // Kubernetes URL library.
    add("url", Func::Url, vec![g(&[Str], Type::Url)]);
    add("isURL", Func::IsUrl, vec![g(&[Str], Bool)]);
    for (name, func) in [
        ("getScheme", Func::GetScheme),
        ("getHost", Func::GetHost),
        ("getHostname", Func::GetHostname),
        ("getPort", Func::GetPort),
        ("getEscapedPath", Func::GetEscapedPath),
    ] {
        add(name, func, vec![m(&[Type::Url], Str)]);
    }
    add(
        "getQuery",
        Func::GetQuery,
        vec![m(&[Type::Url], Type::map(Str, list(Str)))],
    );

    // Kubernetes format library.
    for (i, name) in super::format::QUALIFIED.iter().enumerate() {
        add(name, Func::FormatConst(i as u8), vec![g(&[], Type::Format)]);
    }
    add(
        "format.named",
        Func::FormatNamed,
        vec![g(&[Str], Type::optional(Type::Format))],
    );
    add(
        "validate",
        Func::FormatValidate,
        vec![m(&[Type::Format, Str], Type::optional(list(Str)))],
    );

    // Optional types.
    let opt_a = Type::optional(A);
    add(
        "optional.of",
        Func::OptionalOf,
        vec![g(&[A], opt_a.clone())],
    );
    add(
        "optional.none",
        Func::OptionalNone,
        // `optional_type(V)`: a free type, bound by its use (`optional.none().orValue(true)`).
        vec![g(&[], opt_a.clone())],
    );
    add(
        "optional.ofNonZeroValue",
        Func::OptionalOfNonZeroValue,
        vec![g(&[A], opt_a.clone())],
    );
    add(
        "optional.unwrap",
        Func::OptionalUnwrap,
        vec![g(&[list(opt_a.clone())], list(A))],
    );
    add(
        "unwrapOpt",
        Func::OptionalUnwrap,
        vec![m(&[list(opt_a.clone())], list(A))],
    );
    add(
        "hasValue",
        Func::HasValue,
        vec![m(std::slice::from_ref(&opt_a), Bool)],
    );
    add(
        "value",
        Func::OptValue,
        vec![m(std::slice::from_ref(&opt_a), A)],
    );
    add(
        "or",
        Func::OptOr,
        vec![m(&[opt_a.clone(), opt_a.clone()], opt_a.clone())],
    );
    add("orValue", Func::OptOrValue, vec![m(&[opt_a.clone(), A], A)]);
    add("first", Func::First, vec![m(&[list(A)], opt_a.clone())]);
    add("last", Func::Last, vec![m(&[list(A)], opt_a.clone())]);
    add(
        "_?._",
        Func::OptSelect,
        vec![
            g(&[map_ab.clone(), Str], Type::optional(B)),
            g(&[Type::optional(map_ab), Str], Type::optional(B)),
        ],
    );
    d
}
