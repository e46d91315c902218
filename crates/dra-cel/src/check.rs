//! The checker: turns the `cel` crate's parsed AST into a typed program tree (`Node`) for the
//! DRA environment, reporting compile errors with cel-go's texts and positions.
use std::collections::HashMap;
use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};

use super::decls::{DECLS, Func};
use super::types::{Subst, Type, assignable, most_general, substitute};
use super::value::{DomainsOf, Value};

/// A checked program tree. Member-call receivers are the first argument.
#[derive(Debug)]
pub enum Node {
    Const(Value),
    Local(usize),
    Device,
    /// `device.attributes[<const>].<const>` (or capacity), resolved without building values.
    DeviceLookup {
        of: DomainsOf,
        domain: Arc<str>,
        name: Arc<str>,
    },
    Select {
        operand: Box<Node>,
        field: Arc<str>,
    },
    Presence {
        operand: Box<Node>,
        field: Arc<str>,
    },
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Cond(Box<Node>, Box<Node>, Box<Node>),
    NotStrictlyFalse(Box<Node>),
    Call {
        func: Func,
        args: Vec<Node>,
    },
    List {
        elems: Vec<Node>,
        optional: Vec<bool>,
    },
    Map {
        entries: Vec<(Node, Node, bool)>,
    },
    Comprehension(Box<Comprehension>),
    Bind {
        slot: usize,
        init: Box<Node>,
        body: Box<Node>,
    },
    /// `list.sortBy(x, key)`.
    SortBy {
        target: Box<Node>,
        slot: usize,
        key: Box<Node>,
    },
    /// `opt.optMap(v, expr)` / `opt.optFlatMap(v, expr)`.
    OptMap {
        target: Box<Node>,
        slot: usize,
        body: Box<Node>,
        flat: bool,
    },
}

#[derive(Debug)]
pub struct Comprehension {
    pub range: Node,
    pub iter_slot: usize,
    pub iter2_slot: Option<usize>,
    pub accu_slot: usize,
    pub init: Node,
    pub cond: Node,
    pub step: Node,
    pub result: Node,
}

/// One compile error at a source offset (code points from the start).
#[derive(Debug, Clone)]
pub struct CheckIssue {
    pub offset: Option<u32>,
    pub message: String,
}

struct Scope {
    name: String,
    slot: usize,
    ty: Type,
}

pub struct Checker<'a> {
    source_info: &'a cel::common::ast::SourceInfo,
    scopes: Vec<Scope>,
    pub slots: usize,
    pub issues: Vec<CheckIssue>,
    /// Issues of cel-go's AST validators, reported only when checking found nothing else.
    pub deferred: Vec<CheckIssue>,
    /// How many calls named `format` enclose the expression being checked: the string-format
    /// validator exempts their literals from the homogeneous-literal check.
    in_format: usize,
    /// Checked type of each expression, for validators that look at subexpressions (final
    /// types after `check_root`).
    pub(crate) types: HashMap<u64, Type>,
    /// Bindings of free type variables (cel-go's `mappings`).
    mappings: Subst,
    next_var: u32,
    /// Aggregate literals for the homogeneous-literal validator, which looks at final types.
    literals: Vec<Literal>,
    /// Whether `device.allowMultipleAllocations` is declared (DRAConsumableCapacity).
    pub multiple_allocations_declared: bool,
}

/// An aggregate literal's element expressions (id, optional): a list's elements, or a map's
/// (key, value) pairs.
enum Literal {
    List(Vec<(u64, bool)>),
    Map(Vec<(u64, u64, bool)>),
}

fn type_value(name: &str) -> Option<Type> {
    Some(match name {
        "int" => Type::Int,
        "uint" => Type::Uint,
        "double" => Type::Double,
        "string" => Type::String,
        "bool" => Type::Bool,
        "bytes" => Type::Bytes,
        "null_type" => Type::Null,
        "list" => Type::list(Type::Dyn),
        "map" => Type::map(Type::Dyn, Type::Dyn),
        "dyn" => Type::Dyn,
        "type" => Type::TypeOf(Arc::new(Type::Dyn)),
        _ => return None,
    })
}

fn attributes_type() -> Type {
    Type::map(Type::String, Type::map(Type::String, Type::Dyn))
}
fn capacity_type() -> Type {
    Type::map(Type::String, Type::map(Type::String, Type::Quantity))
}

/// The dotted name an expression spells (`a.b.c`), if it is only identifiers and selects.
fn qualified_name(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Ident(n) => Some(n.clone()),
        Expr::Select(s) if !s.test => Some(format!("{}.{}", qualified_name(&s.operand)?, s.field)),
        _ => None,
    }
}

fn format_args(types: &[Type], member: bool) -> String {
    let mut out = String::new();
    let rest = if member && !types.is_empty() {
        out.push_str(&types[0].to_string());
        out.push('.');
        &types[1..]
    } else {
        types
    };
    out.push('(');
    for (i, t) in rest.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&t.to_string());
    }
    out.push(')');
    out
}

impl<'a> Checker<'a> {
    pub fn new(source_info: &'a cel::common::ast::SourceInfo) -> Self {
        Checker {
            source_info,
            scopes: Vec::new(),
            slots: 0,
            issues: Vec::new(),
            deferred: Vec::new(),
            in_format: 0,
            types: HashMap::new(),
            mappings: Subst::new(),
            next_var: 0,
            literals: Vec::new(),
            multiple_allocations_declared: true,
        }
    }

    /// Checks a whole expression: the program tree and its final type (free type variables
    /// become `dyn`), then runs the homogeneous-literal validator on the final types.
    pub fn check_root(&mut self, e: &IdedExpr) -> (Node, Type) {
        let (node, ty) = self.check(e);
        let ty = substitute(&self.mappings, &ty, true);
        for t in self.types.values_mut() {
            *t = substitute(&self.mappings, t, true);
        }
        for lit in std::mem::take(&mut self.literals) {
            let unwrap = |t: Type, opt: bool| match t {
                Type::Optional(inner) if opt => (*inner).clone(),
                t => t,
            };
            match lit {
                Literal::List(elems) => {
                    let mut first: Option<Type> = None;
                    for (id, opt) in elems {
                        let t = unwrap(self.final_type(id), opt);
                        match &first {
                            None => first = Some(t),
                            Some(f) if *f != t && !matches!(t, Type::Error) => {
                                self.defer(id, format!("expected type '{f}' but found '{t}'"));
                                break;
                            }
                            _ => {}
                        }
                    }
                }
                Literal::Map(entries) => {
                    let mut first: Option<(Type, Type)> = None;
                    for (kid, vid, opt) in entries {
                        let kt = self.final_type(kid);
                        let vt = unwrap(self.final_type(vid), opt);
                        match &first {
                            None => first = Some((kt, vt)),
                            Some((fk, fv)) => {
                                let (fk, fv) = (fk.clone(), fv.clone());
                                if fk != kt {
                                    self.defer(
                                        kid,
                                        format!("expected type '{fk}' but found '{kt}'"),
                                    );
                                }
                                if fv != vt {
                                    self.defer(
                                        vid,
                                        format!("expected type '{fv}' but found '{vt}'"),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        (node, ty)
    }

    fn final_type(&self, id: u64) -> Type {
        self.types.get(&id).cloned().unwrap_or(Type::Dyn)
    }

    fn fresh_var(&mut self) -> Type {
        self.next_var += 1;
        Type::Var(self.next_var - 1)
    }

    /// A type with the current bindings applied (free variables stay).
    fn resolve(&self, t: &Type) -> Type {
        substitute(&self.mappings, t, false)
    }

    /// cel-go's `isAssignable`: binds type variables only when the whole check succeeds.
    fn is_assignable(&mut self, t1: &Type, t2: &Type) -> bool {
        let mut m = self.mappings.clone();
        if assignable(&mut m, t1, t2) {
            self.mappings = m;
            true
        } else {
            false
        }
    }

    /// Replaces an overload's type parameters with fresh type variables.
    fn instantiate(&mut self, t: &Type, vars: &mut [Option<Type>; 4]) -> Type {
        match t {
            Type::Param(p) => {
                if vars[*p as usize].is_none() {
                    vars[*p as usize] = Some(self.fresh_var());
                }
                vars[*p as usize].clone().unwrap_or(Type::Dyn)
            }
            Type::List(e) => Type::list(self.instantiate(e, vars)),
            Type::Optional(e) => Type::optional(self.instantiate(e, vars)),
            Type::TypeOf(e) => Type::TypeOf(Arc::new(self.instantiate(e, vars))),
            Type::Map(k, v) => {
                let k = self.instantiate(k, vars);
                Type::map(k, self.instantiate(v, vars))
            }
            other => other.clone(),
        }
    }

    fn error(&mut self, id: u64, message: String) -> (Node, Type) {
        let offset = self.source_info.offset_for(id).map(|(start, _)| start);
        self.issues.push(CheckIssue { offset, message });
        (Node::Const(Value::Null), Type::Error)
    }

    fn defer(&mut self, id: u64, message: String) {
        let offset = self.source_info.offset_for(id).map(|(start, _)| start);
        self.deferred.push(CheckIssue { offset, message });
    }

    /// The identifier written just before a call's `(` (macros hide the original name).
    fn name_before(&self, id: u64) -> Option<String> {
        let (start, _) = self.source_info.offset_for(id)?;
        let prefix: String = self
            .source_info
            .source
            .chars()
            .take(start as usize)
            .collect();
        let name: String = prefix
            .trim_end()
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        Some(name.chars().rev().collect())
    }

    fn push_scope(&mut self, name: &str, ty: Type) -> usize {
        let slot = self.slots;
        self.slots += 1;
        self.scopes.push(Scope {
            name: name.to_string(),
            slot,
            ty,
        });
        slot
    }

    fn lookup_local(&self, name: &str) -> Option<(usize, Type)> {
        self.scopes
            .iter()
            .rev()
            .find(|s| s.name == name)
            .map(|s| (s.slot, s.ty.clone()))
    }

    pub fn check(&mut self, e: &IdedExpr) -> (Node, Type) {
        let (node, ty) = self.check_expr(e);
        self.types.insert(e.id, ty.clone());
        (node, ty)
    }

    fn check_expr(&mut self, e: &IdedExpr) -> (Node, Type) {
        match &e.expr {
            Expr::Unspecified => self.error(e.id, "unspecified expression".into()),
            Expr::Literal(lit) => literal(lit),
            Expr::Ident(name) => self.check_ident(e.id, name),
            Expr::Select(sel) => self.check_select(e, sel),
            Expr::Call(call) if call.func_name == "format" => {
                self.in_format += 1;
                let checked = self.check_call(e, call);
                self.in_format -= 1;
                checked
            }
            Expr::Call(call) => self.check_call(e, call),
            Expr::List(list) => {
                let mut elems = Vec::with_capacity(list.elements.len());
                let mut optional = Vec::with_capacity(list.elements.len());
                let mut elem_type: Option<Type> = None;
                let mut literal = Vec::with_capacity(list.elements.len());
                for (i, el) in list.elements.iter().enumerate() {
                    let (node, ty) = self.check(el);
                    let mut ty = self.resolve(&ty);
                    let is_opt = list.optional_indices.contains(&i);
                    literal.push((el.id, is_opt));
                    if is_opt {
                        ty = match ty {
                            Type::Optional(inner) => (*inner).clone(),
                            t if t.is_dyn_like() => t,
                            other => {
                                self.error(el.id, format!("found no matching overload for '_?_' applied to '({other})'"));
                                Type::Error
                            }
                        };
                    }
                    elem_type = Some(self.join_types(elem_type, ty));
                    elems.push(node);
                    optional.push(is_opt);
                }
                if self.in_format == 0 {
                    self.literals.push(Literal::List(literal));
                }
                // An empty list's element type is a free type variable.
                let elem_type = match elem_type {
                    Some(t) => t,
                    None => self.fresh_var(),
                };
                let t = Type::list(elem_type);
                (Node::List { elems, optional }, t)
            }
            Expr::Map(map) => {
                let mut entries = Vec::with_capacity(map.entries.len());
                let (mut kt, mut vt): (Option<Type>, Option<Type>) = (None, None);
                let mut literal = Vec::with_capacity(map.entries.len());
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            let (kn, ktype) = self.check(&me.key);
                            let (vn, vtype) = self.check(&me.value);
                            let ktype = self.resolve(&ktype);
                            let mut vtype = self.resolve(&vtype);
                            if me.optional {
                                vtype = match vtype {
                                    Type::Optional(inner) => (*inner).clone(),
                                    t => t,
                                };
                            }
                            literal.push((me.key.id, me.value.id, me.optional));
                            kt = Some(self.join_types(kt, ktype));
                            vt = Some(self.join_types(vt, vtype));
                            entries.push((kn, vn, me.optional));
                        }
                        EntryExpr::StructField(_) => {
                            return self
                                .error(entry.id, "struct literals are not supported".into());
                        }
                    }
                }
                if self.in_format == 0 {
                    self.literals.push(Literal::Map(literal));
                }
                // An empty map's key and value types are free type variables.
                let (kt, vt) = match (kt, vt) {
                    (Some(k), Some(v)) => (k, v),
                    _ => (self.fresh_var(), self.fresh_var()),
                };
                let t = Type::map(kt, vt);
                (Node::Map { entries }, t)
            }
            Expr::Struct(s) => self.error(
                e.id,
                format!(
                    "undeclared reference to '{}' (in container '')",
                    s.type_name
                ),
            ),
            Expr::Comprehension(c) => {
                // The crate also expands `existsOne(x, p)`, which Kubernetes does not declare.
                if self.name_before(e.id).as_deref() == Some("existsOne") {
                    return self.error(
                        e.id,
                        "undeclared reference to 'existsOne' (in container '')".into(),
                    );
                }
                let (range, range_type) = self.check(&c.iter_range);
                let (init, init_type) = self.check(&c.accu_init);
                let range_type = self.resolve(&range_type);
                if matches!(range_type, Type::Var(_)) {
                    self.is_assignable(&Type::Dyn, &range_type);
                }
                let (iter_type, iter2_type) = match &range_type {
                    Type::List(el) => {
                        if c.iter_var2.is_some() {
                            (Type::Int, (**el).clone())
                        } else {
                            ((**el).clone(), Type::Dyn)
                        }
                    }
                    Type::Map(k, v) => ((**k).clone(), (**v).clone()),
                    t if t.is_dyn_like() || matches!(t, Type::Var(_)) => (Type::Dyn, Type::Dyn),
                    other => {
                        let other = substitute(&self.mappings, other, true);
                        let msg = format!(
                            "expression of type '{other}' cannot be range of a comprehension (must be list, map, or dynamic)"
                        );
                        self.error(c.iter_range.id, msg);
                        (Type::Error, Type::Error)
                    }
                };
                // The accumulator keeps the initial value's type: for `map` and `filter` that
                // is `list(T)` with a free T, which the step binds (cel-go's inference).
                let accu_slot = self.push_scope(&c.accu_var, init_type.clone());
                let iter_slot = self.push_scope(&c.iter_var, iter_type);
                let iter2_slot = c.iter_var2.as_ref().map(|v| self.push_scope(v, iter2_type));
                let (cond, cond_type) = self.check(&c.loop_cond);
                self.assert_type(c.loop_cond.id, &Type::Bool, &cond_type);
                let (step, step_type) = self.check(&c.loop_step);
                self.assert_type(c.loop_step.id, &init_type, &step_type);
                if iter2_slot.is_some() {
                    self.scopes.pop();
                }
                self.scopes.pop();
                let (result, result_type) = self.check(&c.result);
                let result_type = self.resolve(&result_type);
                self.scopes.pop();
                let node = Node::Comprehension(Box::new(Comprehension {
                    range,
                    iter_slot,
                    iter2_slot,
                    accu_slot,
                    init,
                    cond,
                    step,
                    result,
                }));
                (node, result_type)
            }
        }
    }

    /// cel-go's `joinTypes` for aggregate literal elements.
    fn join_types(&mut self, previous: Option<Type>, current: Type) -> Type {
        match previous {
            None => current,
            Some(prev) if self.is_assignable(&prev, &current) => most_general(&prev, &current),
            // Incompatible elements make the literal `dyn`; the homogeneous-literal
            // validator (deferred issues) reports them.
            Some(_) => Type::Dyn,
        }
    }

    /// cel-go's `assertType`.
    fn assert_type(&mut self, id: u64, expected: &Type, actual: &Type) {
        if !self.is_assignable(expected, actual) {
            let expected = substitute(&self.mappings, expected, true);
            let actual = substitute(&self.mappings, actual, true);
            self.error(
                id,
                format!("expected type '{expected}' but found '{actual}'"),
            );
        }
    }

    fn check_ident(&mut self, id: u64, name: &str) -> (Node, Type) {
        if let Some((slot, ty)) = self.lookup_local(name) {
            return (Node::Local(slot), ty);
        }
        if name == "device" {
            return (Node::Device, Type::Device);
        }
        if let Some(t) = type_value(name) {
            let type_name = match &t {
                Type::List(_) => "list".to_string(),
                Type::Map(..) => "map".to_string(),
                Type::TypeOf(_) => "type".to_string(),
                // The type value's name is `null_type` (the checker prints the type as `null`).
                Type::Null => "null_type".to_string(),
                other => other.to_string(),
            };
            return (
                Node::Const(Value::Type(Arc::from(type_name))),
                Type::TypeOf(Arc::new(t)),
            );
        }
        self.error(
            id,
            format!("undeclared reference to '{name}' (in container '')"),
        )
    }

    fn check_select(&mut self, e: &IdedExpr, sel: &cel::common::ast::SelectExpr) -> (Node, Type) {
        // `a.b` may name a qualified identifier only when `a` is not a variable; none of the
        // DRA environment's identifiers are qualified, so report it as cel-go would.
        if !sel.test
            && let Some(q) = qualified_name(e)
        {
            let root = q.split('.').next().unwrap_or_default();
            // The IP/CIDR libraries declare their types under qualified names.
            let qualified_type = match q.as_str() {
                "net.IP" => Some(Type::Ip),
                "net.CIDR" => Some(Type::Cidr),
                // The standard library declares the well-known types' names as type values.
                "google.protobuf.Duration" => Some(Type::Duration),
                "google.protobuf.Timestamp" => Some(Type::Timestamp),
                _ => None,
            };
            if let (Some(t), None) = (qualified_type, self.lookup_local(root)) {
                return (
                    Node::Const(Value::Type(Arc::from(q.as_str()))),
                    Type::TypeOf(Arc::new(t)),
                );
            }
            // Anything else is checked operand first, as cel-go does: an unknown root is
            // reported by itself ("undeclared reference to 'foo'" for `foo.bar`).
        }
        let (operand, operand_type) = self.check(&sel.operand);
        let operand_type = self.resolve(&operand_type);
        if matches!(operand_type, Type::Var(_)) {
            self.is_assignable(&Type::Dyn, &operand_type);
        }
        let field: Arc<str> = Arc::from(sel.field.as_str());
        let ty = match &operand_type {
            Type::Device => match &*field {
                "driver" => Type::String,
                "attributes" => attributes_type(),
                "capacity" => capacity_type(),
                "allowMultipleAllocations" if self.multiple_allocations_declared => Type::Bool,
                _ => return self.error(e.id, format!("undefined field '{field}'")),
            },
            Type::Map(_, v) => (**v).clone(),
            t if t.is_dyn_like() || matches!(t, Type::Var(_)) => Type::Dyn,
            other => {
                return self.error(
                    e.id,
                    format!("type '{other}' does not support field selection"),
                );
            }
        };
        if sel.test {
            return (
                Node::Presence {
                    operand: Box::new(operand),
                    field,
                },
                Type::Bool,
            );
        }
        // Constant device lookups skip building intermediate values at run time.
        if let Node::Call {
            func: Func::Index,
            args,
        } = &operand
            && let [
                Node::Select {
                    operand: inner,
                    field: which,
                },
                Node::Const(Value::String(domain)),
            ] = args.as_slice()
            && matches!(**inner, Node::Device)
        {
            let of = match &**which {
                "attributes" => Some(DomainsOf::Attributes),
                "capacity" => Some(DomainsOf::Capacity),
                _ => None,
            };
            if let Some(of) = of {
                let node = Node::DeviceLookup {
                    of,
                    domain: domain.clone(),
                    name: field,
                };
                return (node, ty);
            }
        }
        (
            Node::Select {
                operand: Box::new(operand),
                field,
            },
            ty,
        )
    }

    fn check_call(&mut self, e: &IdedExpr, call: &cel::common::ast::CallExpr) -> (Node, Type) {
        let name = call.func_name.as_str();
        // Namespaced functions (`optional.of`, `sets.contains`, `cel.bind`) parse as member calls
        // on an identifier that is not a variable.
        if let Some(target) = &call.target {
            if let Some(q) = qualified_name(target) {
                let root = q.split('.').next().unwrap_or_default();
                if self.lookup_local(root).is_none() && root != "device" {
                    let full = format!("{q}.{name}");
                    if full == "cel.bind" {
                        return self.check_bind(e, call);
                    }
                    if DECLS.contains_key(full.as_str()) {
                        return self.check_function(e.id, &full, None, &call.args);
                    }
                }
            }
            if let Some(result) = self.check_two_var_macro(e, name, target, &call.args) {
                return result;
            }
            match name {
                "optMap" | "optFlatMap" if call.args.len() == 2 => {
                    if let Expr::Ident(var) = &call.args[0].expr {
                        let (target_node, target_type) = self.check(target);
                        let target_type = self.resolve(&target_type);
                        let inner = match &target_type {
                            Type::Optional(t) => (**t).clone(),
                            t if t.is_dyn_like() || matches!(t, Type::Var(_)) => Type::Dyn,
                            other => {
                                let msg = format!(
                                    "found no matching overload for '{name}' applied to '{other}.(dyn, dyn)'"
                                );
                                return self.error(e.id, msg);
                            }
                        };
                        let slot = self.push_scope(var, inner);
                        let (body, body_type) = self.check(&call.args[1]);
                        self.scopes.pop();
                        let flat = name == "optFlatMap";
                        let ty = if flat {
                            body_type
                        } else {
                            Type::optional(body_type)
                        };
                        let node = Node::OptMap {
                            target: Box::new(target_node),
                            slot,
                            body: Box::new(body),
                            flat,
                        };
                        return (node, ty);
                    }
                }
                _ => {}
            }
        }
        self.check_function(e.id, name, call.target.as_deref(), &call.args)
    }

    /// cel-go's two-variable comprehensions and `sortBy`, built directly as program trees
    /// (the crate's parser does not expand them).
    fn check_two_var_macro(
        &mut self,
        e: &IdedExpr,
        name: &str,
        target: &IdedExpr,
        args: &[IdedExpr],
    ) -> Option<(Node, Type)> {
        let ident = |a: &IdedExpr| match &a.expr {
            Expr::Ident(n) => Some(n.clone()),
            _ => None,
        };
        let sort_by = name == "sortBy" && args.len() == 2;
        let two_var = matches!(name, "all" | "exists" | "existsOne" | "exists_one")
            && args.len() == 3
            || matches!(name, "transformList" | "transformMap" | "transformMapEntry")
                && (args.len() == 3 || args.len() == 4);
        if !sort_by && !two_var {
            return None;
        }
        let first = ident(&args[0])?;
        let second = if sort_by {
            None
        } else {
            Some(ident(&args[1])?)
        };
        let (range, range_type) = self.check(target);
        let range_type = self.resolve(&range_type);
        if matches!(range_type, Type::Var(_)) {
            self.is_assignable(&Type::Dyn, &range_type);
        }
        let (k_type, v_type) = match &range_type {
            Type::List(el) => (Type::Int, (**el).clone()),
            Type::Map(k, v) => ((**k).clone(), (**v).clone()),
            t if t.is_dyn_like() || matches!(t, Type::Var(_)) => (Type::Dyn, Type::Dyn),
            other => {
                let msg = format!(
                    "expression of type '{other}' cannot be range of a comprehension (must be list, map, or dynamic)"
                );
                return Some(self.error(target.id, msg));
            }
        };
        if sort_by {
            let elem_type = if let Type::List(el) = &range_type {
                (**el).clone()
            } else {
                Type::Dyn
            };
            let slot = self.push_scope(&first, elem_type);
            let (key, _) = self.check(&args[1]);
            self.scopes.pop();
            let node = Node::SortBy {
                target: Box::new(range),
                slot,
                key: Box::new(key),
            };
            return Some((node, range_type));
        }
        let second = second?;
        let accu_slot = self.push_scope("@result", Type::Dyn);
        let iter_slot = self.push_scope(&first, k_type.clone());
        let iter2_slot = self.push_scope(&second, v_type);
        let bodies: Vec<(Node, Type)> = args[2..].iter().map(|a| self.check(a)).collect();
        self.scopes.truncate(self.scopes.len() - 3);
        let accu = || Box::new(Node::Local(accu_slot));
        let konst = |v: Value| Node::Const(v);
        let mut bodies = bodies.into_iter();
        let (init, cond, step, result, ty) = match name {
            "all" | "exists" => {
                let (pred, _) = bodies.next()?;
                let is_all = name == "all";
                let cond_inner = if is_all {
                    Node::Local(accu_slot)
                } else {
                    Node::Call {
                        func: Func::Not,
                        args: vec![Node::Local(accu_slot)],
                    }
                };
                let step = if is_all {
                    Node::And(accu(), Box::new(pred))
                } else {
                    Node::Or(accu(), Box::new(pred))
                };
                (
                    konst(Value::Bool(is_all)),
                    Node::NotStrictlyFalse(Box::new(cond_inner)),
                    step,
                    Node::Local(accu_slot),
                    Type::Bool,
                )
            }
            "existsOne" | "exists_one" => {
                let (pred, _) = bodies.next()?;
                let inc = Node::Call {
                    func: Func::Add,
                    args: vec![Node::Local(accu_slot), konst(Value::Int(1))],
                };
                let step = Node::Cond(Box::new(pred), Box::new(inc), accu());
                let result = Node::Call {
                    func: Func::Eq,
                    args: vec![Node::Local(accu_slot), konst(Value::Int(1))],
                };
                (
                    konst(Value::Int(0)),
                    konst(Value::Bool(true)),
                    step,
                    result,
                    Type::Bool,
                )
            }
            _ => {
                let mut parts: Vec<(Node, Type)> = bodies.collect();
                let (expr, expr_type) = parts.pop()?;
                let filter = parts.pop().map(|(n, _)| n);
                let (init, add, ty) = if name == "transformMapEntry" {
                    let add = Node::Call {
                        func: Func::MapMerge,
                        args: vec![Node::Local(accu_slot), expr],
                    };
                    let empty = Value::Map(Arc::new(super::value::MapValue::default()));
                    let ty = match expr_type {
                        Type::Map(..) => expr_type,
                        _ => Type::map(Type::Dyn, Type::Dyn),
                    };
                    (Node::Const(empty), add, ty)
                } else if name == "transformList" {
                    let add = Node::Call {
                        func: Func::Add,
                        args: vec![
                            Node::Local(accu_slot),
                            Node::List {
                                elems: vec![expr],
                                optional: vec![false],
                            },
                        ],
                    };
                    (
                        Node::Const(Value::List(Arc::new(Vec::new()))),
                        add,
                        Type::list(expr_type),
                    )
                } else {
                    let add = Node::Call {
                        func: Func::MapInsert,
                        args: vec![Node::Local(accu_slot), Node::Local(iter_slot), expr],
                    };
                    let empty = Value::Map(Arc::new(super::value::MapValue::default()));
                    (Node::Const(empty), add, Type::map(k_type, expr_type))
                };
                let step = match filter {
                    Some(f) => Node::Cond(Box::new(f), Box::new(add), accu()),
                    None => add,
                };
                (
                    init,
                    konst(Value::Bool(true)),
                    step,
                    Node::Local(accu_slot),
                    ty,
                )
            }
        };
        let _ = e;
        let node = Node::Comprehension(Box::new(Comprehension {
            range,
            iter_slot,
            iter2_slot: Some(iter2_slot),
            accu_slot,
            init,
            cond,
            step,
            result,
        }));
        Some((node, ty))
    }

    fn check_bind(&mut self, e: &IdedExpr, call: &cel::common::ast::CallExpr) -> (Node, Type) {
        let [var, init, body] = call.args.as_slice() else {
            return self.error(e.id, "cel.bind() requires 3 arguments".into());
        };
        let Expr::Ident(var_name) = &var.expr else {
            return self.error(
                var.id,
                "cel.bind() variable names must be simple identifiers".into(),
            );
        };
        let (init_node, init_type) = self.check(init);
        let slot = self.push_scope(var_name, init_type);
        let (body_node, body_type) = self.check(body);
        self.scopes.pop();
        (
            Node::Bind {
                slot,
                init: Box::new(init_node),
                body: Box::new(body_node),
            },
            body_type,
        )
    }

    fn check_function(
        &mut self,
        id: u64,
        name: &str,
        target: Option<&IdedExpr>,
        args: &[IdedExpr],
    ) -> (Node, Type) {
        let mut nodes = Vec::with_capacity(args.len() + 1);
        let mut types = Vec::with_capacity(args.len() + 1);
        if let Some(t) = target {
            let (n, ty) = self.check(t);
            nodes.push(n);
            types.push(ty);
        }
        for a in args {
            let (n, ty) = self.check(a);
            nodes.push(n);
            types.push(ty);
        }
        // cel-go checks the operands of `&&` and `||` as bools directly.
        if matches!(name, "_&&_" | "_||_") {
            let mut bad = false;
            for (arg, ty) in args.iter().zip(&types) {
                if !self.is_assignable(ty, &Type::Bool) {
                    let ty = self.resolve(ty);
                    self.error(arg.id, format!("expected type 'bool' but found '{ty}'"));
                    bad = true;
                }
            }
            if bad {
                return (Node::Const(Value::Null), Type::Bool);
            }
        }
        let Some(decl) = DECLS.get(name) else {
            return self.error(
                id,
                format!("undeclared reference to '{name}' (in container '')"),
            );
        };
        let member = target.is_some();
        let mut result: Option<Type> = None;
        for sig in decl
            .sigs
            .iter()
            .filter(|s| s.member == member && s.params.len() == types.len())
        {
            // Each overload's type parameters become fresh type variables.
            let mut vars: [Option<Type>; 4] = Default::default();
            let params: Vec<Type> = sig
                .params
                .iter()
                .map(|p| self.instantiate(p, &mut vars))
                .collect();
            let sig_result = self.instantiate(&sig.result, &mut vars);
            let mut m = self.mappings.clone();
            if types
                .iter()
                .zip(&params)
                .all(|(a, p)| assignable(&mut m, a, p))
            {
                self.mappings = m;
                let r = self.resolve(&sig_result);
                result = Some(match result {
                    None => r,
                    Some(prev) if prev == Type::Dyn || prev == r => prev,
                    Some(_) => Type::Dyn,
                });
            }
        }
        let Some(result) = result else {
            let types: Vec<Type> = types
                .iter()
                .map(|t| substitute(&self.mappings, t, true))
                .collect();
            if types.iter().any(|t| matches!(t, Type::Error)) {
                return (Node::Const(Value::Null), Type::Error);
            }
            let display = if name == "@in" { "@in" } else { name };
            let msg = format!(
                "found no matching overload for '{display}' applied to '{}'",
                format_args(&types, member)
            );
            return self.error(id, msg);
        };
        if name == "matches" {
            self.validate_regex_literal(&nodes, args, member);
        }
        if matches!(name, "duration" | "timestamp") && !member {
            self.validate_time_literal(name, decl.func, &nodes, args);
        }
        if name == "format"
            && let (Some(target), [list]) = (target, args)
        {
            self.validate_format_call(id, target, list);
        }
        let node = match name {
            "_&&_" | "_||_" => {
                let mut it = nodes.into_iter();
                match (it.next(), it.next()) {
                    (Some(a), Some(b)) => {
                        if name == "_&&_" {
                            Node::And(Box::new(a), Box::new(b))
                        } else {
                            Node::Or(Box::new(a), Box::new(b))
                        }
                    }
                    _ => Node::Const(Value::Null),
                }
            }
            "_?_:_" => {
                let mut it = nodes.into_iter();
                match (it.next(), it.next(), it.next()) {
                    (Some(c), Some(t), Some(f)) => {
                        Node::Cond(Box::new(c), Box::new(t), Box::new(f))
                    }
                    _ => Node::Const(Value::Null),
                }
            }
            "@not_strictly_false" => match nodes.pop() {
                Some(n) => Node::NotStrictlyFalse(Box::new(n)),
                None => Node::Const(Value::Null),
            },
            "sort"
                if member
                    && matches!(
                        substitute(&self.mappings, &types[0], true),
                        Type::List(el) if matches!(
                            *el,
                            Type::Int | Type::Uint | Type::Double | Type::Bool | Type::Duration
                                | Type::Timestamp | Type::String | Type::Bytes
                        )
                    ) =>
            {
                Node::Call {
                    func: Func::SortTracked,
                    args: nodes,
                }
            }
            "sum"
                if member
                    && substitute(&self.mappings, &types[0], true)
                        == Type::list(Type::Duration) =>
            {
                Node::Call {
                    func: Func::SumDurations,
                    args: nodes,
                }
            }
            _ => Node::Call {
                func: decl.func,
                args: nodes,
            },
        };
        (node, result)
    }

    /// cel-go's string-format validator: a literal format string applied to a list literal must
    /// parse, use every argument, and only apply clauses to arguments of suitable types.
    fn validate_format_call(&mut self, id: u64, target: &IdedExpr, list: &IdedExpr) {
        let Expr::Literal(LiteralValue::String(format)) = &target.expr else {
            return;
        };
        let Expr::List(_) = &list.expr else {
            return;
        };
        let args = self.format_arg_children(list).unwrap_or_default();
        if let Err(e) = super::strfmt::validate(format.inner(), &args) {
            self.defer(e.at.unwrap_or(id), e.message);
        }
    }

    /// The element (or key and value) expressions of a list or map literal.
    fn format_arg_children(&self, e: &IdedExpr) -> Option<Vec<super::strfmt::ArgInfo>> {
        let info = |c: &IdedExpr| super::strfmt::ArgInfo {
            id: c.id,
            ty: self
                .types
                .get(&c.id)
                .map(|t| substitute(&self.mappings, t, true))
                .unwrap_or(Type::Dyn),
            children: self.format_arg_children(c),
        };
        match &e.expr {
            Expr::List(l) => Some(l.elements.iter().map(info).collect()),
            Expr::Map(m) => Some(
                m.entries
                    .iter()
                    .filter_map(|entry| match &entry.expr {
                        EntryExpr::MapEntry(me) => Some([info(&me.key), info(&me.value)]),
                        EntryExpr::StructField(_) => None,
                    })
                    .flatten()
                    .collect(),
            ),
            _ => None,
        }
    }

    /// cel-go's duration and timestamp literal validators: a literal argument must convert.
    fn validate_time_literal(&mut self, name: &str, func: Func, nodes: &[Node], args: &[IdedExpr]) {
        let ([Node::Const(value)], [arg]) = (nodes, args) else {
            return;
        };
        if !matches!(arg.expr, Expr::Literal(_)) {
            return;
        }
        if super::eval::convert(func, value).is_err() {
            // An AST validator: reported only when type checking found nothing. cel-go places
            // a negative number literal at its sign; the cel crate at its digits.
            let mut offset = self.source_info.offset_for(arg.id).map(|(start, _)| start);
            // Offsets are in bytes.
            if matches!(value, Value::Int(i) if *i < 0) {
                offset = offset.map(|start| self.sign_before(start));
            }
            self.deferred.push(CheckIssue {
                offset,
                message: format!("invalid {name} argument"),
            });
        }
    }

    /// The offset of the `-` (whitespace allowed in between) before a number at `start`.
    fn sign_before(&self, start: u32) -> u32 {
        let source = self.source_info.source.as_bytes();
        let before = source.get(..start as usize).unwrap_or_default();
        let mut at = before.len();
        while at > 0 && before[at - 1].is_ascii_whitespace() {
            at -= 1;
        }
        if at > 0 && before[at - 1] == b'-' {
            (at - 1) as u32
        } else {
            start
        }
    }

    /// cel-go's regex literal validator: a constant pattern must compile.
    fn validate_regex_literal(&mut self, nodes: &[Node], args: &[IdedExpr], member: bool) {
        // The pattern is the second node both as `s.matches(p)` and as `matches(s, p)`.
        if let Some(Node::Const(Value::String(p))) = nodes.get(1)
            && super::regex::compile(p).is_err()
        {
            let arg = if member { args.first() } else { args.get(1) };
            if let Some(arg) = arg {
                // An AST validator: reported only when type checking found nothing.
                self.defer(arg.id, "invalid matches argument".into());
            }
        }
    }
}

fn literal(lit: &LiteralValue) -> (Node, Type) {
    let (v, t) = match lit {
        LiteralValue::Boolean(b) => (Value::Bool(**b), Type::Bool),
        LiteralValue::Int(i) => (Value::Int(**i), Type::Int),
        LiteralValue::UInt(u) => (Value::Uint(**u), Type::Uint),
        LiteralValue::Double(d) => (Value::Double(**d), Type::Double),
        LiteralValue::String(s) => (Value::string(s.inner()), Type::String),
        LiteralValue::Bytes(b) => (Value::Bytes(Arc::from(b.inner())), Type::Bytes),
        LiteralValue::Null => (Value::Null, Type::Null),
    };
    (Node::Const(v), t)
}

/// Whether a checked result type is acceptable for a selector.
pub fn valid_output(t: &Type) -> bool {
    matches!(t, Type::Bool | Type::Dyn | Type::Error)
}
