//! `<string>.format(<list>)` as cel-go's strings extension implements it at version 2 (the
//! version Kubernetes' base environment uses): the legacy formatter with the `en_US` locale and
//! no precision limit, plus its compile-time validator for literal format strings.
//!
//! Quirks reproduced on purpose: `%f` and `%e` go through `golang.org/x/text/message`, so `%f`
//! groups thousands (`1,234.500000`), infinities print as `∞`, and `%e` prints
//! `2.718280×10⁰⁰` with the "precision" used as a field width (`%.3e` means `%3e`); doubles
//! inside lists and maps use plain `%.6f`.
use std::fmt::Write as _;

use super::eval::format_double_g;
use super::semver::go_quote;
use super::types::Type;
use super::value::Value;

/// A failed format: the offending argument expression (validator only) and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    pub at: Option<u64>,
    pub message: String,
}

fn fail<T>(message: impl Into<String>) -> Result<T, FormatError> {
    Err(FormatError {
        at: None,
        message: message.into(),
    })
}

#[derive(Debug, Clone, Copy)]
enum Clause {
    String,
    Decimal,
    Fixed(Option<usize>),
    Scientific(Option<usize>),
    Binary,
    Hex { upper: bool },
    Octal,
}

/// What the formatter needs from its arguments: runtime values or checked types.
trait Args {
    /// Called before each clause; the runtime fails on a missing argument here.
    fn arg(&mut self, index: usize) -> Result<(), FormatError>;
    fn len(&self) -> usize;
    fn apply(&mut self, index: usize, clause: Clause) -> Result<String, FormatError>;
}

/// Go's `strconv.Atoi` on a run of ASCII digits.
fn atoi(digits: &str) -> Result<usize, String> {
    let prefix = "error while converting precision to integer: strconv.Atoi";
    if digits.is_empty() {
        return Err(format!("{prefix}: parsing \"\": invalid syntax"));
    }
    digits
        .parse::<i64>()
        .ok()
        .and_then(|p| usize::try_from(p).ok())
        .ok_or_else(|| format!("{prefix}: parsing \"{digits}\": value out of range"))
}

/// cel-go's `parseFormattingClause`: returns the bytes read after `%` and the clause.
fn parse_clause(s: &[u8]) -> Result<(usize, Clause), String> {
    let mut i = 0;
    let mut precision = None;
    if s.first() == Some(&b'.') {
        i = 1;
        let start = i;
        loop {
            match s.get(i) {
                None => {
                    return Err(
                        "error while parsing precision: could not find end of precision specifier"
                            .into(),
                    );
                }
                Some(c) if c.is_ascii_digit() => i += 1,
                Some(_) => break,
            }
        }
        // Only ASCII digits were collected, so this slice is valid UTF-8.
        let digits = std::str::from_utf8(&s[start..i]).unwrap_or_default();
        precision = Some(atoi(digits).map_err(|e| format!("error while parsing precision: {e}"))?);
    }
    let Some(&c) = s.get(i) else {
        return Err(
            "error while parsing precision: could not find end of precision specifier".into(),
        );
    };
    let clause = match c {
        b's' => Clause::String,
        b'd' => Clause::Decimal,
        b'f' => Clause::Fixed(precision),
        b'e' => Clause::Scientific(precision),
        b'b' => Clause::Binary,
        b'x' => Clause::Hex { upper: false },
        b'X' => Clause::Hex { upper: true },
        b'o' => Clause::Octal,
        // Go converts the byte, not the character, to a rune.
        other => {
            return Err(format!(
                "unrecognized formatting clause \"{}\"",
                char::from(other)
            ));
        }
    };
    Ok((i + 1, clause))
}

/// cel-go's `parseFormatString`.
fn parse_format(format: &str, args: &mut impl Args) -> Result<String, FormatError> {
    let s = format.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(s.len());
    let mut i = 0;
    let mut index = 0;
    while i < s.len() {
        if s[i] != b'%' {
            out.push(s[i]);
            i += 1;
            continue;
        }
        if s.get(i + 1) == Some(&b'%') {
            out.push(b'%');
            i += 2;
            continue;
        }
        args.arg(index)?;
        if i + 1 >= s.len() {
            return fail("unexpected end of string");
        }
        if index >= args.len() {
            return fail(format!("index {index} out of range"));
        }
        let (read, clause) = parse_clause(&s[i + 1..]).map_err(|e| FormatError {
            at: None,
            message: format!("could not parse formatting clause: {e}"),
        })?;
        let text = args.apply(index, clause).map_err(|e| FormatError {
            at: e.at,
            message: format!("error during formatting: {}", e.message),
        })?;
        out.extend_from_slice(text.as_bytes());
        i += 1 + read;
        index += 1;
    }
    // Only whole UTF-8 sequences are copied, and clauses produce strings.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

// ---- runtime ----

struct RuntimeArgs<'a>(&'a [Value]);

/// `<string>.format(<list>)` at runtime.
pub fn format(format: &str, args: &[Value]) -> Result<String, String> {
    parse_format(format, &mut RuntimeArgs(args)).map_err(|e| e.message)
}

impl Args for RuntimeArgs<'_> {
    fn arg(&mut self, index: usize) -> Result<(), FormatError> {
        if index >= self.0.len() {
            return fail(format!("index {index} out of range"));
        }
        Ok(())
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn apply(&mut self, index: usize, clause: Clause) -> Result<String, FormatError> {
        let Some(v) = self.0.get(index) else {
            return fail(format!("index {index} out of range"));
        };
        apply(v, clause).or_else(fail)
    }
}

fn apply(v: &Value, clause: Clause) -> Result<String, String> {
    let t = v.type_name();
    match clause {
        Clause::String => format_string(v),
        Clause::Decimal => match v {
            Value::Int(i) => Ok(i.to_string()),
            Value::Uint(u) => Ok(u.to_string()),
            _ => Err(format!(
                "decimal clause can only be used on integers, was given {t}"
            )),
        },
        Clause::Fixed(p) => float_arg(v)
            .map(|d| fixed(d, p.unwrap_or(6)))
            .ok_or_else(|| {
                format!("fixed-point clause can only be used on doubles, was given {t}")
            }),
        Clause::Scientific(p) => float_arg(v)
            .map(|d| scientific(d, p.unwrap_or(6)))
            .ok_or_else(|| format!("scientific clause can only be used on doubles, was given {t}")),
        Clause::Binary => match v {
            Value::Int(i) => Ok(signed(*i, |u| format!("{u:b}"))),
            Value::Uint(u) => Ok(format!("{u:b}")),
            Value::Bool(b) => Ok(if *b { "1" } else { "0" }.into()),
            _ => Err(format!(
                "only integers and bools can be formatted as binary, was given {t}"
            )),
        },
        Clause::Hex { upper } => {
            let hex = |u: u64| {
                if upper {
                    format!("{u:X}")
                } else {
                    format!("{u:x}")
                }
            };
            let bytes = |b: &[u8]| {
                b.iter().fold(String::new(), |mut s, c| {
                    let _ = if upper {
                        write!(s, "{c:02X}")
                    } else {
                        write!(s, "{c:02x}")
                    };
                    s
                })
            };
            match v {
                Value::Int(i) => Ok(signed(*i, hex)),
                Value::Uint(u) => Ok(hex(*u)),
                Value::String(s) => Ok(bytes(s.as_bytes())),
                Value::Bytes(b) => Ok(bytes(b)),
                _ => Err(format!(
                    "only integers, byte buffers, and strings can be formatted as hex, was given {t}"
                )),
            }
        }
        Clause::Octal => match v {
            Value::Int(i) => Ok(signed(*i, |u| format!("{u:o}"))),
            Value::Uint(u) => Ok(format!("{u:o}")),
            _ => Err(format!(
                "octal clause can only be used on integers, was given {t}"
            )),
        },
    }
}

/// Go prints negative integers in base 2/8/16 as a sign and the magnitude.
fn signed(i: i64, digits: impl Fn(u64) -> String) -> String {
    if i < 0 {
        format!("-{}", digits(i.unsigned_abs()))
    } else {
        digits(i.unsigned_abs())
    }
}

/// `%f`/`%e` accept doubles and the strings naming the special values.
fn float_arg(v: &Value) -> Option<f64> {
    match v {
        Value::Double(d) => Some(*d),
        Value::String(s) => match &**s {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// x/text's special values: the sign comes from `d < 0`, so `-0.0` prints unsigned.
fn special(d: f64) -> Option<String> {
    if d.is_nan() {
        Some("NaN".into())
    } else if d.is_infinite() {
        Some(if d < 0.0 { "-∞" } else { "∞" }.into())
    } else {
        None
    }
}

fn sign(d: f64) -> &'static str {
    if d < 0.0 { "-" } else { "" }
}

/// x/text `%.Nf` for en_US: thousands grouped with `,`.
fn fixed(d: f64, precision: usize) -> String {
    if let Some(s) = special(d) {
        return s;
    }
    let digits = format!("{:.precision$}", d.abs());
    let (int, frac) = digits.split_once('.').unwrap_or((&digits, ""));
    let mut out = String::from(sign(d));
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// x/text `%We` for en_US (cel-go passes the precision as the width `W`).
fn scientific(d: f64, width: usize) -> String {
    const SUPERSCRIPT: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    let body = special(d).unwrap_or_else(|| {
        let s = format!("{:.6e}", d.abs());
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (exp_sign, exp_digits) = match exp.strip_prefix('-') {
            Some(e) => ("⁻", e),
            None => ("", exp),
        };
        let mut sup: String = exp_digits
            .bytes()
            .map(|b| SUPERSCRIPT[usize::from(b.saturating_sub(b'0')).min(9)])
            .collect();
        if exp_digits.len() < 2 {
            sup.insert(0, '⁰');
        }
        format!("{}{mantissa}×10{exp_sign}{sup}", sign(d))
    });
    let len = body.chars().count();
    format!("{}{body}", " ".repeat(width.saturating_sub(len)))
}

/// cel-go `FormatString`: the top-level `%s`.
fn format_string(v: &Value) -> Result<String, String> {
    match v {
        Value::List(l) => format_list(l),
        Value::Map(m) => format_map(&m.entries),
        Value::Int(i) => Ok(i.to_string()),
        Value::Uint(u) => Ok(u.to_string()),
        Value::Double(d) => Ok(format_double_g(*d)),
        Value::Bool(b) => Ok(b.to_string()),
        Value::String(s) => Ok(s.to_string()),
        Value::Bytes(b) => std::str::from_utf8(b).map(str::to_string).map_err(|_| {
            "could not convert argument \"invalid UTF-8 in bytes, cannot convert to string\" to string"
                .to_string()
        }),
        Value::Type(name) => Ok(name.to_string()),
        Value::Null => Ok("null".into()),
        Value::Duration(d) => Ok(super::time::format_duration(*d)),
        Value::Timestamp(t) => Ok(t.to_rfc3339()),
        other => Err(string_clause_error(other.type_name())),
    }
}

fn string_clause_error(type_name: &str) -> String {
    format!(
        "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given {type_name}"
    )
}

/// cel-go `clauseForType` plus `quoteForCEL`: an element of a list or map.
fn format_element(v: &Value) -> Result<String, String> {
    match v {
        Value::Int(_) | Value::Uint(_) | Value::Bool(_) | Value::Null | Value::Type(_) => {
            format_string(v)
        }
        Value::List(l) => format_list(l),
        Value::Map(m) => format_map(&m.entries),
        Value::String(s) => Ok(go_quote(s)),
        Value::Bytes(_) => Ok(format!("b{}", go_quote(&format_string(v)?))),
        Value::Double(d) if d.is_nan() => Ok("\"NaN\"".into()),
        Value::Double(d) if d.is_infinite() => {
            Ok(if *d > 0.0 { "\"+Inf\"" } else { "\"-Inf\"" }.into())
        }
        Value::Double(d) => Ok(format!("{d:.6}")),
        // Printed as CEL literals.
        Value::Duration(_) => Ok(format!("duration({})", go_quote(&format_string(v)?))),
        Value::Timestamp(_) => Ok(format!("timestamp({})", go_quote(&format_string(v)?))),
        other => Err(format!("no formatting function for {}", other.type_name())),
    }
}

fn format_list(items: &[Value]) -> Result<String, String> {
    let parts = items
        .iter()
        .map(format_element)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(format!("[{}]", parts.join(", ")))
}

fn format_map(entries: &[(Value, Value)]) -> Result<String, String> {
    let mut pairs = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        let key = match k {
            Value::String(s) => go_quote(s),
            Value::Bool(_) | Value::Int(_) | Value::Uint(_) => format_string(k)?,
            other => {
                return Err(format!(
                    "no formatting function for map key of type {}",
                    other.type_name()
                ));
            }
        };
        pairs.push((key, format_element(v)?));
    }
    // Go sorts the entries by their printed keys.
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let parts: Vec<String> = pairs.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
    Ok(format!("{{{}}}", parts.join(", ")))
}

// ---- compile-time validator ----

/// A format argument as the validator sees it: its expression id, checked type, and for list
/// and map literals their element (or key, value, key, ...) expressions.
pub struct ArgInfo {
    pub id: u64,
    pub ty: Type,
    pub children: Option<Vec<ArgInfo>>,
}

struct CheckArgs<'a> {
    args: &'a [ArgInfo],
    requested: usize,
}

/// cel-go's `stringFormatValidator` for a literal format string and a list literal.
pub fn validate(format: &str, args: &[ArgInfo]) -> Result<(), FormatError> {
    let mut check = CheckArgs { args, requested: 0 };
    parse_format(format, &mut check)?;
    if args.len() > check.requested {
        return fail(format!(
            "too many arguments supplied to string.format (expected {}, got {})",
            check.requested,
            args.len()
        ));
    }
    Ok(())
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Kind {
    Int,
    Uint,
    Double,
    Bool,
    String,
    Bytes,
    Null,
    Timestamp,
    Duration,
    List,
    Map,
    Type,
    Other,
}

fn kind(t: &Type) -> Kind {
    match t {
        Type::Int => Kind::Int,
        Type::Uint => Kind::Uint,
        Type::Double => Kind::Double,
        Type::Bool => Kind::Bool,
        Type::String => Kind::String,
        Type::Bytes => Kind::Bytes,
        Type::Null => Kind::Null,
        Type::Timestamp => Kind::Timestamp,
        Type::Duration => Kind::Duration,
        Type::List(_) => Kind::List,
        Type::Map(..) => Kind::Map,
        Type::TypeOf(_) => Kind::Type,
        _ => Kind::Other,
    }
}

/// cel-go `Type.TypeName()` as the validator prints it.
fn type_name(t: &Type) -> String {
    match t {
        Type::List(_) => "list".into(),
        Type::Map(..) => "map".into(),
        Type::TypeOf(_) => "type".into(),
        Type::Optional(_) => "optional_type".into(),
        Type::Null => "null_type".into(),
        // Runtime type names (`TypeName()`), not the checker's short spellings.
        Type::Duration => "google.protobuf.Duration".into(),
        Type::Timestamp => "google.protobuf.Timestamp".into(),
        other => other.to_string(),
    }
}

fn one_of(t: &Type, kinds: &[Kind]) -> bool {
    t.is_dyn_like() || kinds.contains(&kind(t))
}

/// cel-go `verifyString`: the id of the first expression `%s` cannot print.
fn verify_string(arg: &ArgInfo) -> Result<(), &ArgInfo> {
    use Kind::*;
    let ok = [
        List, Map, Int, Uint, Double, Bool, String, Timestamp, Bytes, Duration, Type, Null,
    ];
    if !one_of(&arg.ty, &ok) {
        return Err(arg);
    }
    for child in arg.children.iter().flatten() {
        verify_string(child)?;
    }
    Ok(())
}

impl Args for CheckArgs<'_> {
    fn arg(&mut self, _index: usize) -> Result<(), FormatError> {
        self.requested += 1;
        Ok(())
    }
    fn len(&self) -> usize {
        self.args.len()
    }
    fn apply(&mut self, index: usize, clause: Clause) -> Result<String, FormatError> {
        use Kind::*;
        let Some(arg) = self.args.get(index) else {
            return fail(format!("index {index} out of range"));
        };
        let (kinds, what): (&[Kind], &str) = match clause {
            Clause::String => {
                return match verify_string(arg) {
                    Ok(()) => Ok(std::string::String::new()),
                    Err(bad) => Err(FormatError {
                        at: Some(bad.id),
                        message: string_clause_error(&type_name(&bad.ty)),
                    }),
                };
            }
            Clause::Decimal => (&[Int, Uint], "decimal clause can only be used on integers"),
            Clause::Fixed(_) => (
                &[Double, String],
                "fixed-point clause can only be used on doubles",
            ),
            Clause::Scientific(_) => (
                &[Double, String],
                "scientific clause can only be used on doubles",
            ),
            Clause::Binary => (
                &[Int, Uint, Bool],
                "only integers and bools can be formatted as binary",
            ),
            Clause::Hex { .. } => (
                &[Int, Uint, String, Bytes],
                "only integers, byte buffers, and strings can be formatted as hex",
            ),
            Clause::Octal => (&[Int, Uint], "octal clause can only be used on integers"),
        };
        if one_of(&arg.ty, kinds) {
            Ok(std::string::String::new())
        } else {
            Err(FormatError {
                at: Some(arg.id),
                message: format!("{what}, was given {}", type_name(&arg.ty)),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn formats_like_cel_go_v2() {
        let f = |s: &str, args: Vec<Value>| format(s, &args);
        assert_eq!(
            f(
                "%f|%.2f",
                vec![Value::Double(1234567.891), Value::Double(-0.0)]
            )
            .unwrap(),
            "1,234,567.891000|0.00"
        );
        assert_eq!(
            f("%e", vec![Value::Double(2.71825)]).unwrap(),
            "2.718250×10⁰⁰"
        );
        assert_eq!(f("%e", vec![Value::string("NaN")]).unwrap(), "   NaN");
        assert_eq!(
            f("%x %b", vec![Value::Int(-255), Value::Bool(true)]).unwrap(),
            "-ff 1"
        );
        let list = Value::List(Arc::new(vec![Value::Double(2.5), Value::string("a\u{a0}")]));
        assert_eq!(f("%s", vec![list]).unwrap(), "[2.500000, \"a\\u00a0\"]");
        assert_eq!(
            f("%s %s", vec![Value::Int(1)]).unwrap_err(),
            "index 1 out of range"
        );
    }
}
