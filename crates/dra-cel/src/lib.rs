//! The Kubernetes DRA CEL environment (selectors over `device`), reproducing kube-scheduler's
//! results and error texts.
//!
//! The `cel` crate parses (and expands the standard macros); everything after that is ours: a
//! checker for the DRA declarations and library signatures, constant folding as cel-go's
//! `OptOptimize` does it, and an evaluator over the checked tree with cel-go's runtime cost
//! accounting. The crate's own interpreter is not used: it has no cost tracking and is several
//! times slower than evaluating a pre-resolved tree against a pre-built device view.
mod check;
mod cost;
mod decls;
pub mod device;
mod eval;
mod format;
mod net;
mod regex;
pub mod semver;
mod strfmt;
mod time;
mod types;
mod url;
mod value;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cel::common::ast::{Expr, IdedExpr, SourceInfo};

use check::{Checker, Node};
pub use cost::{CostFeatures, estimate_cost, estimate_cost_with, estimate_derived_cost_with};
pub use device::{DeviceError, DeviceView};
use eval::Ctx;
pub use format::names;
use value::Value;

/// `CELSelectorExpressionMaxLength` (bytes).
pub const MAX_EXPRESSION_LENGTH: usize = 10 * 1024;
/// `CELSelectorExpressionMaxCost`, the runtime cost limit.
pub const MAX_COST: u64 = 1_000_000;
/// cel-go's parser recursion limit.
const MAX_RECURSION_DEPTH: usize = 250;
/// Compilation runs on its own thread with this stack, so hostile nesting cannot overflow.
const COMPILE_STACK_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// Rejected before evaluation (parse, type check, limits, program instantiation).
    #[error("{0}")]
    Compile(String),
    /// Failed while evaluating against a device.
    #[error("{0}")]
    Runtime(String),
}

impl CelError {
    pub fn kind(&self) -> &'static str {
        match self {
            CelError::Compile(_) => "compile",
            CelError::Runtime(_) => "runtime",
        }
    }
    pub fn message(&self) -> &str {
        match self {
            CelError::Compile(m) | CelError::Runtime(m) => m,
        }
    }
}

/// The feature gates the selector environment depends on (Go's `cel.Features`, as the
/// scheduler and the API server build it from their gates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Features {
    /// DRAConsumableCapacity (beta, on in 1.37): declares `device.allowMultipleAllocations`.
    pub consumable_capacity: bool,
}

impl Default for Features {
    /// Kubernetes 1.37's defaults.
    fn default() -> Self {
        Features {
            consumable_capacity: true,
        }
    }
}

/// What a compiled expression must evaluate to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    /// A selector: `bool`.
    Selector,
    /// A derived attribute (DRADerivedAttributes): a primitive scalar, or with `lists` a list of
    /// them. `any_attributes`: attribute values are declared `google.protobuf.Any` (without
    /// DRAListTypeAttributes), which is how type names in errors spell them.
    Derived { lists: bool, any_attributes: bool },
}

/// A derived attribute's value, as a `DeviceAttribute` holds it (versions as their text).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AttributeValue {
    Bool(bool),
    Int(i64),
    String(String),
    Version(String),
    Bools(Vec<bool>),
    Ints(Vec<i64>),
    Strings(Vec<String>),
    Versions(Vec<String>),
}

/// A checked selector, ready to evaluate against many devices.
#[derive(Debug)]
pub struct Selector {
    root: Node,
    slots: usize,
}

/// Compiles a selector expression in Kubernetes 1.37's default environment.
pub fn compile(expression: &str) -> Result<Selector, CelError> {
    compile_with(expression, Features::default())
}

/// Compiles a selector expression in the environment of these feature gates.
pub fn compile_with(expression: &str, features: Features) -> Result<Selector, CelError> {
    if expression.len() > MAX_EXPRESSION_LENGTH {
        return Err(CelError::Compile(format!(
            "Too long: may not be more than {MAX_EXPRESSION_LENGTH} bytes"
        )));
    }
    let source = expression.to_string();
    on_compile_thread(move || compile_on_this_thread(&source, features, Output::Selector))
}

/// Compiles a derived attribute's expression (`derivedAttributes[].expression`) as
/// kube-scheduler does (`GetOrCompileDerivedAttribute`): it must evaluate to a primitive scalar
/// (string, integer, boolean, semver) or, where `lists` allows (the scheduler's stored
/// expressions always do; new ones with DRAListTypeAttributes), a list of them.
/// `list_type_attributes`: the DRAListTypeAttributes gate of the environment.
pub fn compile_derived(
    expression: &str,
    features: Features,
    lists: bool,
    list_type_attributes: bool,
) -> Result<Selector, CelError> {
    if expression.len() > MAX_EXPRESSION_LENGTH {
        return Err(CelError::Compile(format!(
            "Too long: may not be more than {MAX_EXPRESSION_LENGTH} bytes"
        )));
    }
    let source = expression.to_string();
    let output = Output::Derived {
        lists,
        any_attributes: !list_type_attributes,
    };
    on_compile_thread(move || compile_on_this_thread(&source, features, output))
}

/// Runs a compiler pass on its own thread with [`COMPILE_STACK_BYTES`] of stack.
fn on_compile_thread<T: Send + 'static>(
    pass: impl FnOnce() -> Result<T, CelError> + Send + 'static,
) -> Result<T, CelError> {
    let worker = std::thread::Builder::new()
        .name("cel-compile".into())
        .stack_size(COMPILE_STACK_BYTES)
        .spawn(pass);
    match worker {
        Ok(handle) => handle.join().unwrap_or_else(|_| {
            Err(CelError::Compile(
                "internal error: compiler panicked".into(),
            ))
        }),
        Err(e) => Err(CelError::Compile(format!(
            "internal error: cannot start compiler thread: {e}"
        ))),
    }
}

/// Line and column (1-based, code points) of a code-point offset.
fn line_col(source: &str, offset: u32) -> (usize, usize) {
    let mut line = 1;
    let mut col = 1;
    // The crate reports byte offsets; cel-go columns count code points.
    for (i, c) in source.char_indices() {
        if i as u32 >= offset {
            break;
        }
        if c == '\n' {
            line += 1;
            col = 1;
        } else {
            col += 1;
        }
    }
    (line, col)
}

/// cel-go's issue format: `ERROR: <input>:L:C: msg` plus the source line and a caret.
fn format_issue(source: &str, line: usize, col: usize, message: &str) -> String {
    let mut out = format!("ERROR: <input>:{line}:{col}: {message}");
    if let Some(text) = source.lines().nth(line.saturating_sub(1)) {
        out.push_str(&format!(
            "\n | {text}\n | {}^",
            ".".repeat(col.saturating_sub(1))
        ));
    }
    out
}

/// Nesting depth of the parsed tree, counted like cel-go's parser counts recursion.
fn depth(e: &IdedExpr) -> usize {
    let children: Vec<&IdedExpr> = match &e.expr {
        Expr::Call(c) => c.target.iter().map(|t| &**t).chain(c.args.iter()).collect(),
        Expr::Select(s) => vec![&*s.operand],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|en| match &en.expr {
                cel::common::ast::EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                cel::common::ast::EntryExpr::StructField(sf) => vec![&sf.value],
            })
            .collect(),
        Expr::Comprehension(c) => vec![&c.iter_range, &c.accu_init, &c.loop_step, &c.result],
        Expr::Struct(s) => s
            .entries
            .iter()
            .filter_map(|en| match &en.expr {
                cel::common::ast::EntryExpr::StructField(sf) => Some(&sf.value),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    1 + children.into_iter().map(depth).max().unwrap_or(0)
}

/// The parser, limited as cel-go's parse listener limits nesting: more than
/// [`MAX_RECURSION_DEPTH`] nested expressions (the cel crate allows one more than it is given).
fn parser() -> cel::parser::Parser {
    cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .max_recursion_depth((MAX_RECURSION_DEPTH - 1) as u16)
}

/// cel-go's two nesting limits, in its words: its parse listener's (nested expressions) and its
/// AST builder's (nested operators, selects, indexes and calls, [`depth`]).
fn recursion_limit_error() -> CelError {
    CelError::Compile(format!(
        "compilation failed: ERROR: <input>:-1:0: expression recursion limit exceeded: {MAX_RECURSION_DEPTH}"
    ))
}

fn compile_on_this_thread(
    source: &str,
    features: Features,
    output: Output,
) -> Result<Selector, CelError> {
    let parsed = parser().parse_with_source_info(source);
    let (ast, info): (IdedExpr, SourceInfo) = match parsed {
        Ok(p) => p,
        // The cel crate reports its limit with its own error types; Kubernetes users see
        // cel-go's message.
        Err(errors)
            if errors
                .errors
                .iter()
                .any(|e| e.msg.contains("Recursion limit of")) =>
        {
            return Err(recursion_limit_error());
        }
        Err(errors) => {
            let rendered: Vec<String> = errors
                .errors
                .iter()
                .map(|e| {
                    let (line, col) = (e.pos.0.max(1) as usize, e.pos.1.max(1) as usize);
                    format_issue(source, line, col, &e.msg)
                })
                .collect();
            return Err(CelError::Compile(format!(
                "compilation failed: {}",
                rendered.join("\n")
            )));
        }
    };
    if depth(&ast) > MAX_RECURSION_DEPTH + 1 {
        return Err(CelError::Compile(
            "compilation failed: ERROR: <input>:-1:0: max recursion depth exceeded".into(),
        ));
    }
    let mut checker = Checker::new(&info);
    checker.multiple_allocations_declared = features.consumable_capacity;
    let (root, ty) = checker.check_root(&ast);
    if checker.issues.is_empty() {
        // cel-go's AST validators (homogeneous literals) run only after a clean check.
        checker.issues = std::mem::take(&mut checker.deferred);
    }
    // cel-go lists issues in source order.
    checker.issues.sort_by_key(|i| i.offset.unwrap_or(0));
    if !checker.issues.is_empty() {
        let rendered: Vec<String> = checker
            .issues
            .iter()
            .map(|issue| {
                let (line, col) = line_col(source, issue.offset.unwrap_or(0));
                format_issue(source, line, col, &issue.message)
            })
            .collect();
        return Err(CelError::Compile(format!(
            "compilation failed: {}",
            rendered.join("\n")
        )));
    }
    if let Output::Derived {
        lists,
        any_attributes,
    } = output
    {
        if let Some(message) = derived_output_error(&ty, lists, any_attributes) {
            return Err(CelError::Compile(message));
        }
    } else if !check::valid_output(&ty) {
        // cel.Type.String() spells null as `null_type` (FormatCELType says `null`).
        let shown = if ty == types::Type::Null {
            "null_type".to_string()
        } else {
            ty.full_name()
        };
        return Err(CelError::Compile(format!(
            "must evaluate to bool or the unknown type, not {shown}"
        )));
    }
    let slots = checker.slots;
    let root = fold::fold(root)
        .map_err(|e| CelError::Compile(format!("program instantiation failed: {e}")))?;
    Ok(Selector { root, slots })
}

mod fold {
    //! cel-go `OptOptimize` at program instantiation: constant list/map literals and type
    //! conversions of constants are evaluated once (their errors become compile errors),
    //! `x in []` is false, and constant regex patterns must compile.
    use super::check::Node;
    use super::decls::Func;
    use super::value::{MapValue, Value};
    use std::sync::Arc;

    pub fn fold(node: Node) -> Result<Node, String> {
        Ok(match node {
            Node::Call { func, args } => {
                let args = args.into_iter().map(fold).collect::<Result<Vec<_>, _>>()?;
                let is_conversion = matches!(
                    func,
                    Func::ToInt
                        | Func::ToUint
                        | Func::ToDouble
                        | Func::ToString
                        | Func::ToBool
                        | Func::ToBytes
                        | Func::ToDyn
                        | Func::ToDuration
                        | Func::ToTimestamp
                        | Func::TypeOf
                );
                if is_conversion
                    && args.len() == 1
                    && let Node::Const(v) = &args[0]
                {
                    let folded =
                        super::eval::convert(func, v).map_err(|e| e.message.to_string())?;
                    return Ok(Node::Const(folded));
                }
                // A constant index becomes an attribute qualifier when the program is built.
                let time_index = match (func, args.get(1)) {
                    (
                        Func::Index | Func::OptIndex,
                        Some(Node::Const(index @ (Value::Duration(_) | Value::Timestamp(_)))),
                    ) => Some(index),
                    _ => None,
                };
                if let Some(index) = time_index {
                    return Err(super::eval::invalid_qualifier(index));
                }
                if func == Func::In
                    && let Some(Node::Const(Value::List(l))) = args.get(1)
                    && l.is_empty()
                {
                    return Ok(Node::Const(Value::Bool(false)));
                }
                if matches!(func, Func::Matches | Func::Find | Func::FindAll)
                    && let Some(Node::Const(Value::String(p))) = args.get(1)
                {
                    super::regex::cached(p).map_err(|e| e.to_string())?;
                }
                Node::Call { func, args }
            }
            Node::List { elems, optional } => {
                let elems = elems.into_iter().map(fold).collect::<Result<Vec<_>, _>>()?;
                if optional.iter().all(|o| !o) && elems.iter().all(|e| matches!(e, Node::Const(_)))
                {
                    let values = elems
                        .into_iter()
                        .filter_map(|e| {
                            if let Node::Const(v) = e {
                                Some(v)
                            } else {
                                None
                            }
                        })
                        .collect();
                    return Ok(Node::Const(Value::List(Arc::new(values))));
                }
                Node::List { elems, optional }
            }
            Node::Map { entries } => {
                let entries = entries
                    .into_iter()
                    .map(|(k, v, o)| Ok((fold(k)?, fold(v)?, o)))
                    .collect::<Result<Vec<_>, String>>()?;
                let all_const = entries.iter().all(|(k, v, o)| {
                    !o && matches!(k, Node::Const(_)) && matches!(v, Node::Const(_))
                });
                let valid_keys = entries.iter().all(|(k, _, _)| {
                    matches!(
                        k,
                        Node::Const(
                            Value::String(_)
                                | Value::Int(_)
                                | Value::Uint(_)
                                | Value::Bool(_)
                                | Value::Duration(_)
                                | Value::Timestamp(_)
                        )
                    )
                });
                if all_const && valid_keys {
                    let mut out: Vec<(Value, Value)> = Vec::new();
                    for (k, v, _) in entries {
                        if let (Node::Const(k), Node::Const(v)) = (k, v) {
                            if let Some(slot) = out
                                .iter_mut()
                                .find(|(k2, _)| super::value::same_literal_key(k2, &k))
                            {
                                slot.1 = v;
                            } else {
                                out.push((k, v));
                            }
                        }
                    }
                    return Ok(Node::Const(Value::Map(Arc::new(MapValue { entries: out }))));
                }
                Node::Map { entries }
            }
            Node::Select { operand, field } => Node::Select {
                operand: Box::new(fold(*operand)?),
                field,
            },
            Node::Presence { operand, field } => Node::Presence {
                operand: Box::new(fold(*operand)?),
                field,
            },
            Node::And(a, b) => Node::And(Box::new(fold(*a)?), Box::new(fold(*b)?)),
            Node::Or(a, b) => Node::Or(Box::new(fold(*a)?), Box::new(fold(*b)?)),
            Node::Cond(c, t, f) => Node::Cond(
                Box::new(fold(*c)?),
                Box::new(fold(*t)?),
                Box::new(fold(*f)?),
            ),
            Node::NotStrictlyFalse(n) => Node::NotStrictlyFalse(Box::new(fold(*n)?)),
            Node::Comprehension(c) => {
                let c = *c;
                Node::Comprehension(Box::new(super::check::Comprehension {
                    range: fold(c.range)?,
                    iter_slot: c.iter_slot,
                    iter2_slot: c.iter2_slot,
                    accu_slot: c.accu_slot,
                    init: fold(c.init)?,
                    cond: fold(c.cond)?,
                    step: fold(c.step)?,
                    result: fold(c.result)?,
                }))
            }
            Node::Bind { slot, init, body } => Node::Bind {
                slot,
                init: Box::new(fold(*init)?),
                body: Box::new(fold(*body)?),
            },
            Node::SortBy { target, slot, key } => Node::SortBy {
                target: Box::new(fold(*target)?),
                slot,
                key: Box::new(fold(*key)?),
            },
            Node::OptMap {
                target,
                slot,
                body,
                flat,
            } => Node::OptMap {
                target: Box::new(fold(*target)?),
                slot,
                body: Box::new(fold(*body)?),
                flat,
            },
            other => other,
        })
    }
}

/// Go's `ConvertToNative(bool)` failure text for a non-bool result.
fn not_bool_message(v: &Value) -> String {
    let detail = match v {
        Value::Int(_) => "unsupported type conversion from 'int' to bool".to_string(),
        Value::Uint(_) => "unsupported type conversion from 'uint' to bool".to_string(),
        Value::Double(_) => "type conversion error from Double to 'bool'".to_string(),
        Value::String(_) => "unsupported native conversion from string to 'bool'".to_string(),
        Value::Bytes(_) => "type conversion error from Bytes to 'bool'".to_string(),
        Value::List(_) => "type conversion error from list to 'bool'".to_string(),
        Value::Map(_) | Value::Domains(_) | Value::Device => {
            "type conversion error from map to 'bool'".to_string()
        }
        Value::Null => "type conversion error from 'null_type' to 'bool'".to_string(),
        Value::Quantity(_) => "type conversion error from 'Quantity' to 'bool'".to_string(),
        Value::Semver(_) => "type conversion error from 'Semver' to 'bool'".to_string(),
        Value::Ip(_) => "type conversion error from 'IP' to 'bool'".to_string(),
        Value::Cidr(_) => "type conversion error from 'CIDR' to 'bool'".to_string(),
        Value::Format(_) => "type conversion error from 'Format' to 'bool'".to_string(),
        Value::Url(_) => "type conversion error from 'URL' to 'bool'".to_string(),
        Value::Duration(_) => "type conversion error from 'Duration' to 'bool'".to_string(),
        Value::Timestamp(_) => "type conversion error from 'Timestamp' to 'bool'".to_string(),
        Value::Optional(None) => "optional.none() dereference".to_string(),
        Value::Optional(Some(_)) => "type conversion error from optional to 'bool'".to_string(),
        Value::Type(_) => "type conversion not supported for 'type'".to_string(),
        Value::Bool(_) => String::new(),
    };
    format!(
        "CEL result of type {} could not be converted to bool: {detail}",
        v.type_name()
    )
}

/// Kubernetes' `EnhanceRuntimeError`: a hint for missing keys.
fn enhance_runtime_error(message: &str) -> String {
    if message.contains("no such key:") {
        format!(
            "{message}. consider using CEL optional chaining (.? followed by orValue()) or guarding the check with has() for optional fields"
        )
    } else {
        message.to_string()
    }
}

impl Selector {
    /// Evaluates a derived attribute's expression (compiled by [`compile_derived`]) on one
    /// device: its value, or the error kube-scheduler reports (`EvaluateDerivedAttribute`).
    pub fn evaluate_attribute(&self, device: &DeviceView) -> Result<AttributeValue, CelError> {
        let value = self
            .value(device, MAX_COST)?
            .map_err(|e| CelError::Runtime(e.message.to_string()))?;
        attribute_value(&value).map_err(CelError::Runtime)
    }

    /// The expression's value on one device; the outer error is the device's own (an
    /// attribute that could not be converted), the inner one evaluation's.
    fn value(
        &self,
        device: &DeviceView,
        cost_limit: u64,
    ) -> Result<Result<Value, eval::EvalError>, CelError> {
        if let Some(e) = &device.conversion_error {
            return Err(CelError::Runtime(e.clone()));
        }
        let mut ctx = Ctx {
            device,
            locals: vec![Ok(Value::Null); self.slots],
            cost: 0,
            limit: cost_limit,
        };
        Ok(eval::eval(&self.root, &mut ctx))
    }

    /// Evaluates against one device with the default cost limit.
    pub fn evaluate(&self, device: &DeviceView) -> Result<bool, CelError> {
        self.evaluate_with_limit(device, MAX_COST)
    }

    pub fn evaluate_with_limit(
        &self,
        device: &DeviceView,
        cost_limit: u64,
    ) -> Result<bool, CelError> {
        match self.value(device, cost_limit)? {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(CelError::Runtime(not_bool_message(&other))),
            Err(e) => Err(CelError::Runtime(enhance_runtime_error(&e.message))),
        }
    }
}

/// `isAllowedDerivedAttributeType`: a primitive scalar (or `dyn`/`any`), or a list of one.
fn derived_output_error(ty: &types::Type, lists: bool, any_attributes: bool) -> Option<String> {
    use types::Type;
    let scalar = |t: &Type| {
        matches!(
            t,
            Type::Bool | Type::Int | Type::String | Type::Dyn | Type::Semver
        )
    };
    let allowed = scalar(ty) || (lists && matches!(ty, Type::List(e) if scalar(e)));
    if allowed {
        return None;
    }
    let mut shown = if *ty == Type::Null {
        "null_type".to_string()
    } else {
        ty.full_name()
    };
    if any_attributes {
        // Without DRAListTypeAttributes the environment declares attribute values `Any`.
        shown = shown.replace(
            "map(string, map(string, dyn))",
            "map(string, map(string, google.protobuf.Any))",
        );
    }
    Some(if lists {
        format!(
            "must evaluate to a primitive scalar (string, integer, boolean, semver) or a list of these scalars, not {shown}"
        )
    } else {
        format!(
            "must evaluate to a primitive scalar (string, integer, boolean, semver), not {shown}"
        )
    })
}

/// Go's `%T` of a CEL value's native form, as derived-attribute errors name types.
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "structpb.NullValue",
        Value::Bool(_) => "bool",
        Value::Int(_) => "int64",
        Value::Uint(_) => "uint64",
        Value::Double(_) => "float64",
        Value::String(_) => "string",
        Value::Bytes(_) => "[]uint8",
        Value::List(_) => "[]ref.Val",
        Value::Map(_) | Value::Domains(_) | Value::Device => "map[ref.Val]ref.Val",
        Value::Quantity(_) => "*resource.Quantity",
        Value::Semver(_) => "semver.Version",
        Value::Ip(_) => "netip.Addr",
        Value::Cidr(_) => "netip.Prefix",
        Value::Url(_) => "*url.URL",
        Value::Duration(_) => "time.Duration",
        Value::Timestamp(_) => "time.Time",
        Value::Format(_) => "*library.NamedFormat",
        Value::Optional(_) => "*types.Optional",
        Value::Type(_) => "*types.Type",
    }
}

/// `valToDeviceAttribute`.
fn attribute_value(v: &Value) -> Result<AttributeValue, String> {
    Ok(match v {
        Value::Bool(b) => AttributeValue::Bool(*b),
        Value::Int(i) => AttributeValue::Int(*i),
        Value::String(s) => AttributeValue::String(s.to_string()),
        Value::Semver(s) => AttributeValue::Version(s.to_string()),
        Value::List(items) => {
            let Some(first) = items.first() else {
                return Ok(AttributeValue::Strings(Vec::new()));
            };
            fn all<T>(
                items: &[Value],
                kind: &str,
                get: impl Fn(&Value) -> Option<T>,
            ) -> Result<Vec<T>, String> {
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        get(item).ok_or_else(|| {
                            format!(
                                "expected list element at index {i} to be {kind}, got {}",
                                go_type(item)
                            )
                        })
                    })
                    .collect()
            }
            match first {
                Value::Bool(_) => AttributeValue::Bools(all(items, "bool", |v| match v {
                    Value::Bool(b) => Some(*b),
                    _ => None,
                })?),
                Value::Int(_) => AttributeValue::Ints(all(items, "int", |v| match v {
                    Value::Int(i) => Some(*i),
                    _ => None,
                })?),
                Value::String(_) => AttributeValue::Strings(all(items, "string", |v| match v {
                    Value::String(s) => Some(s.to_string()),
                    _ => None,
                })?),
                Value::Semver(_) => AttributeValue::Versions(all(items, "semver", |v| match v {
                    Value::Semver(s) => Some(s.to_string()),
                    _ => None,
                })?),
                other => {
                    return Err(format!("unsupported list element type: {}", go_type(other)));
                }
            }
        }
        other => return Err(format!("unsupported CEL return type: {}", go_type(other))),
    })
}

/// Compiled selectors keyed by environment and expression text: each distinct expression
/// compiles once per environment.
#[derive(Default)]
pub struct SelectorCache {
    entries: Mutex<HashMap<(Features, String), Compiled>>,
}

/// One expression's compilation, shared by every user of the cache.
type Compiled = Arc<Result<Selector, CelError>>;

impl SelectorCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Compiled in Kubernetes 1.37's default environment.
    pub fn get_or_compile(&self, expression: &str) -> Arc<Result<Selector, CelError>> {
        self.get_or_compile_with(expression, Features::default())
    }

    pub fn get_or_compile_with(
        &self,
        expression: &str,
        features: Features,
    ) -> Arc<Result<Selector, CelError>> {
        let key = (features, expression.to_string());
        if let Ok(map) = self.entries.lock()
            && let Some(hit) = map.get(&key)
        {
            return hit.clone();
        }
        let compiled = Arc::new(compile_with(expression, features));
        if let Ok(mut map) = self.entries.lock() {
            map.insert(key, compiled.clone());
        }
        compiled
    }
}

/// Compiles (via `cache`) and evaluates one expression on one device.
pub fn evaluate(
    cache: &SelectorCache,
    expression: &str,
    device: &DeviceView,
) -> Result<bool, CelError> {
    match &*cache.get_or_compile(expression) {
        Ok(selector) => selector.evaluate(device),
        Err(e) => Err(e.clone()),
    }
}

#[cfg(test)]
mod tests;
