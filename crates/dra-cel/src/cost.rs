//! Compile-time cost estimation as kube-apiserver validates DRA selectors: a port of cel-go's
//! `checker/cost.go` with Kubernetes' `library.CostEstimator` and the size estimator of
//! `k8s.io/dynamic-resource-allocation/cel` (NewExpressions environment).
//!
//! The estimate works on cel-go's checked tree: macros the crate's parser leaves as calls
//! (`cel.bind`, two-variable comprehensions, `sortBy`, `optMap`) are expanded here as cel-go
//! expands them, because the expansion is what gets costed.
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};

use super::CelError;
use super::check::Checker;
use super::types::Type;

const STRING_TRAVERSAL: f64 = 0.1;
const REGEX_LENGTH: f64 = 0.25;
const LIST_CREATE: u64 = 10;
const MAP_CREATE: u64 = 30;
const STRUCT_CREATE: u64 = 40;
const ACCU: &str = "@result";
const HIDDEN_ACCU: &str = "__result__";

#[derive(Clone, Copy, Debug, PartialEq)]
struct Est {
    min: u64,
    max: u64,
}

const UNKNOWN: Est = Est {
    min: 0,
    max: u64::MAX,
};

fn fixed(v: u64) -> Est {
    Est { min: v, max: v }
}

fn mul_u64(x: u64, y: u64) -> u64 {
    x.saturating_mul(y)
}

fn mul_factor(x: u64, y: f64) -> u64 {
    let xf = x as f64;
    if xf > 0.0 && y > 0.0 && xf > u64::MAX as f64 / y {
        return u64::MAX;
    }
    let c = (xf * y).ceil();
    if c >= 18446744073709551616.0 {
        return u64::MAX;
    }
    c as u64
}

impl Est {
    fn add(self, o: Est) -> Est {
        Est {
            min: self.min.saturating_add(o.min),
            max: self.max.saturating_add(o.max),
        }
    }
    fn mul(self, o: Est) -> Est {
        Est {
            min: mul_u64(self.min, o.min),
            max: mul_u64(self.max, o.max),
        }
    }
    fn factor(self, f: f64) -> Est {
        Est {
            min: mul_factor(self.min, f),
            max: mul_factor(self.max, f),
        }
    }
    fn union(self, o: Est) -> Est {
        Est {
            min: self.min.min(o.min),
            max: self.max.max(o.max),
        }
    }
}

enum Lit {
    Str(u64),
    Bytes(u64),
    Scalar { int: Option<i64>, is_false: bool },
}

enum K {
    Lit(Lit),
    Ident(String),
    Select {
        op: Box<X>,
        field: String,
        test: bool,
    },
    Call {
        func: String,
        target: Option<Box<X>>,
        args: Vec<X>,
    },
    List(Vec<X>),
    Map(Vec<(X, X)>),
    Struct(Vec<X>),
    Comp(Box<Comp>),
}

struct Comp {
    range: X,
    iter: String,
    iter2: Option<String>,
    accu: String,
    init: X,
    cond: X,
    step: X,
    result: X,
}

struct X {
    id: u64,
    ty: Type,
    k: K,
}

/// The element type a `map`/`filter` step appends (`@result + [t]`, maybe under a filter).
fn step_elem(step: &X) -> Option<Type> {
    match &step.k {
        K::Call { func, args, .. } if func == "_+_" && args.len() == 2 => match &args[1].k {
            K::List(l) if l.len() == 1 => Some(norm(&l[0].ty)),
            _ => None,
        },
        K::Call { func, args, .. } if func == "_?_:_" && args.len() == 3 => step_elem(&args[1]),
        _ => None,
    }
}

/// Turns the crate's tree into cel-go's checked tree (types from our checker).
struct Builder<'a> {
    types: &'a HashMap<u64, Type>,
    next_id: u64,
    locals: Vec<String>,
    /// Element types of iteration variables where cel-go knows more than our checker.
    var_types: Vec<(String, Type)>,
}

fn qualified_name(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Ident(n) => Some(n.clone()),
        Expr::Select(s) if !s.test => Some(format!("{}.{}", qualified_name(&s.operand)?, s.field)),
        _ => None,
    }
}

fn elem_of(t: &Type) -> Type {
    match t {
        Type::List(e) => (**e).clone(),
        _ => Type::Dyn,
    }
}

impl Builder<'_> {
    fn fresh(&mut self, ty: Type, k: K) -> X {
        self.next_id += 1;
        X {
            id: self.next_id,
            ty,
            k,
        }
    }
    fn ty(&self, id: u64) -> Type {
        self.types.get(&id).cloned().unwrap_or(Type::Dyn)
    }
    fn ident(&mut self, name: &str, ty: Type) -> X {
        self.fresh(ty, K::Ident(name.to_string()))
    }
    fn call(&mut self, func: &str, target: Option<X>, args: Vec<X>, ty: Type) -> X {
        self.fresh(
            ty,
            K::Call {
                func: func.to_string(),
                target: target.map(Box::new),
                args,
            },
        )
    }
    fn lit_bool(&mut self, b: bool) -> X {
        self.fresh(
            Type::Bool,
            K::Lit(Lit::Scalar {
                int: None,
                is_false: !b,
            }),
        )
    }
    fn lit_int(&mut self, i: i64) -> X {
        self.fresh(
            Type::Int,
            K::Lit(Lit::Scalar {
                int: Some(i),
                is_false: false,
            }),
        )
    }
    fn empty_list(&mut self) -> X {
        self.fresh(Type::list(Type::Dyn), K::List(Vec::new()))
    }

    fn with_locals<T>(&mut self, names: &[&str], f: impl FnOnce(&mut Self) -> T) -> T {
        let n = self.locals.len();
        self.locals.extend(names.iter().map(|s| s.to_string()));
        let r = f(self);
        self.locals.truncate(n);
        r
    }

    fn bind(&mut self, var: &str, init: X, body: impl FnOnce(&mut Self) -> X, ty: Type) -> X {
        let range = self.empty_list();
        let cond = self.lit_bool(false);
        let step = self.ident(var, init.ty.clone());
        let result = self.with_locals(&[var], body);
        let ty = if wild(&ty) { result.ty.clone() } else { ty };
        self.fresh(
            ty,
            K::Comp(Box::new(Comp {
                range,
                iter: "#unused".into(),
                iter2: None,
                accu: var.to_string(),
                init,
                cond,
                step,
                result,
            })),
        )
    }

    fn build(&mut self, e: &IdedExpr) -> X {
        let mut ty = self.ty(e.id);
        if let Expr::Ident(n) = &e.expr
            && let Some((_, t)) = self.var_types.iter().rev().find(|(v, _)| v == n)
            && wild(&ty)
        {
            ty = t.clone();
        }
        let k = match &e.expr {
            Expr::Unspecified => K::Lit(Lit::Scalar {
                int: None,
                is_false: false,
            }),
            Expr::Literal(l) => K::Lit(match l {
                LiteralValue::String(s) => Lit::Str(s.inner().chars().count() as u64),
                LiteralValue::Bytes(b) => Lit::Bytes(b.inner().len() as u64),
                LiteralValue::Int(i) => Lit::Scalar {
                    int: Some(**i),
                    is_false: false,
                },
                LiteralValue::Boolean(b) => Lit::Scalar {
                    int: None,
                    is_false: !**b,
                },
                _ => Lit::Scalar {
                    int: None,
                    is_false: false,
                },
            }),
            Expr::Ident(n) => K::Ident(n.clone()),
            Expr::Select(s) => K::Select {
                op: Box::new(self.build(&s.operand)),
                field: s.field.clone(),
                test: s.test,
            },
            Expr::List(l) => K::List(l.elements.iter().map(|x| self.build(x)).collect()),
            Expr::Map(m) => K::Map(
                m.entries
                    .iter()
                    .filter_map(|en| match &en.expr {
                        EntryExpr::MapEntry(me) => {
                            Some((self.build(&me.key), self.build(&me.value)))
                        }
                        _ => None,
                    })
                    .collect(),
            ),
            Expr::Struct(s) => K::Struct(
                s.entries
                    .iter()
                    .filter_map(|en| match &en.expr {
                        EntryExpr::StructField(sf) => Some(self.build(&sf.value)),
                        _ => None,
                    })
                    .collect(),
            ),
            Expr::Comprehension(c) => {
                let range = self.build(&c.iter_range);
                let init = self.build(&c.accu_init);
                let refined = match (&range.ty, &c.iter_var2) {
                    (Type::List(el), None) if !wild(el) => {
                        Some(((**el).clone(), c.iter_var.clone()))
                    }
                    _ => None,
                };
                let n_var_types = self.var_types.len();
                match refined {
                    Some((el, v)) => self.var_types.push((v, el)),
                    // An unrefined variable shadows outer refinements of the same name.
                    None => self.var_types.push((c.iter_var.clone(), Type::Dyn)),
                }
                let mut names = vec![c.accu_var.as_str(), c.iter_var.as_str()];
                if let Some(v2) = &c.iter_var2 {
                    names.push(v2.as_str());
                }
                let (cond, step) =
                    self.with_locals(&names, |b| (b.build(&c.loop_cond), b.build(&c.loop_step)));
                self.var_types.truncate(n_var_types);
                let mut result = self.with_locals(&[c.accu_var.as_str()], |b| b.build(&c.result));
                // cel-go types the accumulator of `map`/`filter` with a type parameter, so the
                // result is `list(T)` where our checker says `list(dyn)`.
                let mut ty = ty;
                if matches!(&init.k, K::List(l) if l.is_empty())
                    && let Some(el) = step_elem(&step)
                {
                    ty = Type::list(el);
                    if matches!(&result.k, K::Ident(n) if *n == c.accu_var) {
                        result.ty = ty.clone();
                    }
                }
                let k = K::Comp(Box::new(Comp {
                    range,
                    iter: c.iter_var.clone(),
                    iter2: c.iter_var2.clone(),
                    accu: c.accu_var.clone(),
                    init,
                    cond,
                    step,
                    result,
                }));
                return X { id: e.id, ty, k };
            }
            Expr::Call(call) => return self.build_call(e, ty, call),
        };
        X { id: e.id, ty, k }
    }

    fn build_call(&mut self, e: &IdedExpr, ty: Type, call: &cel::common::ast::CallExpr) -> X {
        let name = call.func_name.as_str();
        let ident = |a: &IdedExpr| match &a.expr {
            Expr::Ident(n) => Some(n.clone()),
            _ => None,
        };
        if let Some(target) = &call.target {
            if let Some(q) = qualified_name(target) {
                let root = q.split('.').next().unwrap_or_default();
                if !self.locals.iter().any(|l| l == root) && root != "device" {
                    let full = format!("{q}.{name}");
                    if full == "cel.bind"
                        && call.args.len() == 3
                        && let Some(var) = ident(&call.args[0])
                    {
                        let init = self.build(&call.args[1]);
                        return self.bind(&var, init, |b| b.build(&call.args[2]), ty);
                    }
                    let args = call.args.iter().map(|a| self.build(a)).collect();
                    return X {
                        id: e.id,
                        ty,
                        k: K::Call {
                            func: full,
                            target: None,
                            args,
                        },
                    };
                }
            }
            let args = &call.args;
            let two_var = matches!(name, "all" | "exists" | "existsOne" | "exists_one")
                && args.len() == 3
                || matches!(name, "transformList" | "transformMap" | "transformMapEntry")
                    && (args.len() == 3 || args.len() == 4);
            if two_var && let (Some(k), Some(v)) = (ident(&args[0]), ident(&args[1])) {
                let range = self.build(target);
                let (init, cond, step, result) = self
                    .with_locals(&[ACCU, k.as_str(), v.as_str()], |b| {
                        b.two_var(name, &k, &args[2..], &ty)
                    });
                return X {
                    id: e.id,
                    ty,
                    k: K::Comp(Box::new(Comp {
                        range,
                        iter: k,
                        iter2: Some(v),
                        accu: ACCU.into(),
                        init,
                        cond,
                        step,
                        result,
                    })),
                };
            }
            if name == "sortBy"
                && args.len() == 2
                && let Some(var) = ident(&args[0])
            {
                let t = self.build(target);
                let tt = t.ty.clone();
                let input = "@__sortBy_input__";
                let ty = match &ty {
                    Type::List(el) if wild(el) => tt.clone(),
                    _ => ty,
                };
                let el = elem_of(&tt);
                return self.bind(
                    input,
                    t,
                    |b| {
                        let range = b.ident(input, tt.clone());
                        let init = b.empty_list();
                        let cond = b.lit_bool(true);
                        let (step, key_ty) = b.with_locals(&[ACCU, var.as_str()], |b| {
                            b.var_types.push((var.clone(), el.clone()));
                            let key = b.build(&args[1]);
                            b.var_types.pop();
                            let kt = key.ty.clone();
                            let accu = b.ident(ACCU, Type::list(kt.clone()));
                            let one = b.fresh(Type::list(kt.clone()), K::List(vec![key]));
                            (
                                b.call("_+_", None, vec![accu, one], Type::list(kt.clone())),
                                kt,
                            )
                        });
                        let result = b.ident(ACCU, Type::list(key_ty.clone()));
                        let keys = b.fresh(
                            Type::list(key_ty),
                            K::Comp(Box::new(Comp {
                                range,
                                iter: var.clone(),
                                iter2: None,
                                accu: ACCU.into(),
                                init,
                                cond,
                                step,
                                result,
                            })),
                        );
                        let target = b.ident(input, tt.clone());
                        b.call(
                            "@sortByAssociatedKeys",
                            Some(target),
                            vec![keys],
                            tt.clone(),
                        )
                    },
                    ty,
                );
            }
            if matches!(name, "optMap" | "optFlatMap")
                && call.args.len() == 2
                && let Some(var) = ident(&call.args[0])
            {
                let t = self.build(target);
                let t2 = self.build(target);
                let inner = match &t.ty {
                    Type::Optional(i) => (**i).clone(),
                    _ => Type::Dyn,
                };
                let has = self.call("hasValue", Some(t), vec![], Type::Bool);
                let value = self.call("value", Some(t2), vec![], inner);
                let body_ty = if name == "optMap" {
                    match &ty {
                        Type::Optional(i) => (**i).clone(),
                        _ => Type::Dyn,
                    }
                } else {
                    ty.clone()
                };
                let mut then = self.bind(&var, value, |b| b.build(&call.args[1]), body_ty);
                if name == "optMap" {
                    then = self.call("optional.of", None, vec![then], ty.clone());
                }
                let none = self.call("optional.none", None, vec![], ty.clone());
                return X {
                    id: e.id,
                    ty,
                    k: K::Call {
                        func: "_?_:_".into(),
                        target: None,
                        args: vec![has, then, none],
                    },
                };
            }
        }
        let target = call.target.as_ref().map(|t| Box::new(self.build(t)));
        let args: Vec<X> = call.args.iter().map(|a| self.build(a)).collect();
        let mut ty = ty;
        // List functions return their target's (refined) type.
        if let (Some(t), Type::List(el)) = (&target, &ty)
            && wild(el)
            && matches!(name, "sort" | "distinct" | "reverse" | "slice")
            && matches!(&t.ty, Type::List(_))
        {
            ty = t.ty.clone();
        }
        // `sort` has one overload per element type: several match a dynamic element type,
        // and cel-go then types the call `dyn`.
        if name == "sort" {
            match target.as_ref().map(|t| &t.ty) {
                Some(Type::List(el)) if wild(el) => ty = Type::Dyn,
                Some(t) if wild(t) => ty = Type::Dyn,
                _ => {}
            }
        }
        // Concatenation unifies the element types, widening to the dynamic one.
        if name == "_+_"
            && matches!(&ty, Type::List(el) if wild(el))
            && args.len() == 2
            && let (Type::List(a), Type::List(b)) = (&args[0].ty, &args[1].ty)
            && !wild(a)
            && norm(a) == norm(b)
        {
            ty = args[0].ty.clone();
        }
        if name == "_?_:_"
            && wild(&ty)
            && args.len() == 3
            && !wild(&args[1].ty)
            && norm(&args[1].ty) == norm(&args[2].ty)
        {
            ty = args[1].ty.clone();
        }
        if name == "_[_]"
            && wild(&ty)
            && let Some(Type::List(el)) = args.first().map(|a| &a.ty)
        {
            ty = (**el).clone();
        }
        X {
            id: e.id,
            ty,
            k: K::Call {
                func: name.to_string(),
                target,
                args,
            },
        }
    }

    /// cel-go's `ext.TwoVarComprehensions` expansions: (init, cond, step, result).
    fn two_var(&mut self, name: &str, k: &str, bodies: &[IdedExpr], ty: &Type) -> (X, X, X, X) {
        match name {
            "all" | "exists" => {
                let is_all = name == "all";
                let pred = self.build(&bodies[0]);
                let init = self.lit_bool(is_all);
                let a = self.ident(ACCU, Type::Bool);
                let inner = if is_all {
                    a
                } else {
                    self.call("!_", None, vec![a], Type::Bool)
                };
                let cond = self.call("@not_strictly_false", None, vec![inner], Type::Bool);
                let a = self.ident(ACCU, Type::Bool);
                let step = self.call(
                    if is_all { "_&&_" } else { "_||_" },
                    None,
                    vec![a, pred],
                    Type::Bool,
                );
                let result = self.ident(ACCU, Type::Bool);
                (init, cond, step, result)
            }
            "existsOne" | "exists_one" => {
                let pred = self.build(&bodies[0]);
                let init = self.lit_int(0);
                let cond = self.lit_bool(true);
                let a = self.ident(ACCU, Type::Int);
                let one = self.lit_int(1);
                let inc = self.call("_+_", None, vec![a, one], Type::Int);
                let a = self.ident(ACCU, Type::Int);
                let step = self.call("_?_:_", None, vec![pred, inc, a], Type::Int);
                let a = self.ident(ACCU, Type::Int);
                let one = self.lit_int(1);
                let result = self.call("_==_", None, vec![a, one], Type::Bool);
                (init, cond, step, result)
            }
            _ => {
                let mut parts: Vec<X> = bodies.iter().map(|b| self.build(b)).collect();
                // The macro parser gives a transform one or two bodies; none is estimated as an empty list.
                let expr = parts.pop().unwrap_or_else(|| self.empty_list());
                let filter = parts.pop();
                let (init, add) = if name == "transformList" {
                    let init = self.empty_list();
                    let a = self.ident(ACCU, ty.clone());
                    let one = self.fresh(Type::list(expr.ty.clone()), K::List(vec![expr]));
                    (init, self.call("_+_", None, vec![a, one], ty.clone()))
                } else {
                    let init = self.fresh(Type::map(Type::Dyn, Type::Dyn), K::Map(Vec::new()));
                    let a = self.ident(ACCU, ty.clone());
                    let args = if name == "transformMap" {
                        let kk = self.ident(k, Type::Dyn);
                        vec![a, kk, expr]
                    } else {
                        vec![a, expr]
                    };
                    (init, self.call("cel.@mapInsert", None, args, ty.clone()))
                };
                let step = match filter {
                    Some(f) => {
                        let a = self.ident(ACCU, ty.clone());
                        self.call("_?_:_", None, vec![f, add, a], ty.clone())
                    }
                    None => add,
                };
                let cond = self.lit_bool(true);
                let result = self.ident(ACCU, ty.clone());
                (init, cond, step, result)
            }
        }
    }
}

/// The DRA environment's declared types (NewExpressions, consumable capacity enabled).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Decl {
    Device,
    OuterAttrs,
    InnerAttrs,
    Attr,
    OuterCaps,
    InnerCaps,
    Quantity,
    Domain,
    Id,
    Driver,
    MultiAlloc,
}

impl Decl {
    fn max_elements(self) -> u64 {
        match self {
            Decl::Device | Decl::Quantity => 0,
            Decl::OuterAttrs | Decl::InnerAttrs | Decl::OuterCaps | Decl::InnerCaps => 32,
            Decl::Attr => 64,
            Decl::Domain | Decl::Driver => 63,
            Decl::Id => 32,
            Decl::MultiAlloc => 1,
        }
    }
    fn elem(self) -> Option<Decl> {
        match self {
            Decl::OuterAttrs => Some(Decl::InnerAttrs),
            Decl::InnerAttrs => Some(Decl::Attr),
            Decl::OuterCaps => Some(Decl::InnerCaps),
            Decl::InnerCaps => Some(Decl::Quantity),
            _ => None,
        }
    }
    fn key(self) -> Option<Decl> {
        match self {
            Decl::OuterAttrs | Decl::OuterCaps => Some(Decl::Domain),
            Decl::InnerAttrs | Decl::InnerCaps => Some(Decl::Id),
            _ => None,
        }
    }
}

fn decl_of(path: &[String]) -> Option<Decl> {
    if path.first().map(String::as_str) != Some("device") {
        return None;
    }
    let mut cur = Decl::Device;
    for name in &path[1..] {
        cur = match name.as_str() {
            "@items" | "@values" => cur.elem()?,
            "@keys" => cur.key()?,
            field => {
                let f = if cur == Decl::Device {
                    match field {
                        "driver" => Some(Decl::Driver),
                        "attributes" => Some(Decl::OuterAttrs),
                        "capacity" => Some(Decl::OuterCaps),
                        "allowMultipleAllocations" => Some(Decl::MultiAlloc),
                        _ => None,
                    }
                } else {
                    None
                };
                match f {
                    Some(d) => d,
                    None if cur.elem() == Some(Decl::Attr) => Decl::Attr,
                    None => return None,
                }
            }
        };
    }
    Some(cur)
}

/// The DRA `sizeEstimator.EstimateSize`.
fn estimate_size(path: &[String]) -> Option<Est> {
    decl_of(path).map(|d| Est {
        min: 0,
        max: d.max_elements(),
    })
}

/// A Go `[]string` with its backing array: cel-go builds paths with `append`, and appending
/// twice to a slice with spare capacity overwrites the first append's element (two-variable
/// comprehensions get `@values` in their key path that way), so the estimate depends on it.
#[derive(Clone, Default)]
struct GoPath {
    arr: Option<Rc<RefCell<Vec<String>>>>,
    len: usize,
}

impl GoPath {
    fn of(items: Vec<String>) -> GoPath {
        let len = items.len();
        GoPath {
            arr: Some(Rc::new(RefCell::new(items))),
            len,
        }
    }
    fn cap(&self) -> usize {
        self.arr.as_ref().map_or(0, |a| a.borrow().len())
    }
    fn append(&self, s: &str) -> GoPath {
        let cap = self.cap();
        if let Some(arr) = self.arr.clone().filter(|_| self.len < cap) {
            arr.borrow_mut()[self.len] = s.to_string();
            return GoPath {
                arr: Some(arr),
                len: self.len + 1,
            };
        }
        // growslice: double (16-byte elements round up to themselves below 256).
        let new_len = self.len + 1;
        let new_cap = if new_len > 2 * cap { new_len } else { 2 * cap };
        let mut v = self.read();
        v.push(s.to_string());
        v.resize(new_cap, String::new());
        GoPath {
            arr: Some(Rc::new(RefCell::new(v))),
            len: new_len,
        }
    }
    fn read(&self) -> Vec<String> {
        match &self.arr {
            Some(a) => a.borrow()[..self.len].to_vec(),
            None => Vec::new(),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    List,
    Map,
    Unknown,
}

#[derive(Clone, Copy)]
struct Entry {
    container: Kind,
    key: Est,
    val: Est,
}

fn entry_union(a: Option<Entry>, b: Option<Entry>) -> Option<Entry> {
    let (a, b) = (a?, b?);
    Some(Entry {
        container: a.container,
        key: a.key.union(b.key),
        val: a.val.union(b.val),
    })
}

#[derive(Clone)]
struct Local {
    path: GoPath,
    size: Option<Est>,
    entry: Option<Entry>,
}

/// cel-go's `AstNode` as estimators see it.
#[derive(Clone)]
struct Node<'x> {
    path: GoPath,
    ty: Type,
    expr: Option<&'x X>,
    size: Option<Est>,
}

fn is_scalar(t: &Type) -> bool {
    match t {
        Type::Bool | Type::Double | Type::Int | Type::Uint | Type::Duration | Type::Timestamp => {
            true
        }
        Type::Optional(i) => is_scalar(i),
        _ => false,
    }
}

fn params(t: &Type) -> Vec<Type> {
    match t {
        Type::List(e) => vec![(**e).clone()],
        Type::Map(k, v) => vec![(**k).clone(), (**v).clone()],
        Type::Optional(i) => vec![(**i).clone()],
        Type::TypeOf(i) => vec![(**i).clone()],
        _ => Vec::new(),
    }
}

fn wild(t: &Type) -> bool {
    matches!(t, Type::Dyn | Type::Error | Type::Param(_))
}

fn norm(t: &Type) -> Type {
    match t {
        Type::Param(_) => Type::Dyn,
        Type::List(e) => Type::list(norm(e)),
        Type::Map(k, v) => Type::map(norm(k), norm(v)),
        Type::Optional(i) => Type::optional(norm(i)),
        other => other.clone(),
    }
}

struct Coster {
    paths: HashMap<u64, GoPath>,
    locals: HashMap<String, Vec<Local>>,
    sizes: HashMap<u64, Est>,
    entries: HashMap<u64, Entry>,
    /// The first error cel-go's cost environment reports, and the node it is reported at.
    error: Option<(u64, String)>,
    /// DRAListTypeAttributes: attribute values are `dyn` (iterable) instead of `any`.
    list: bool,
}

fn lit_int(x: &X) -> Option<i64> {
    match &x.k {
        K::Lit(Lit::Scalar { int, .. }) => *int,
        _ => None,
    }
}

/// cel-go's `nodeAsUintValue`: an int literal, negative ones as 0.
fn node_as_uint(n: &Node, default: u64) -> u64 {
    match n.expr.and_then(lit_int) {
        Some(i) => u64::try_from(i).unwrap_or(0),
        None => default,
    }
}

impl Coster {
    fn peek(&self, name: &str) -> Option<&Local> {
        self.locals.get(name).and_then(|v| v.last())
    }
    fn push(&mut self, name: &str, l: Local) {
        self.locals.entry(name.to_string()).or_default().push(l);
    }
    fn pop(&mut self, name: &str) {
        if let Some(v) = self.locals.get_mut(name) {
            v.pop();
        }
    }

    fn get_path(&self, e: &X) -> GoPath {
        if let K::Ident(n) = &e.k
            && let Some(v) = self.peek(n)
        {
            return v.path.clone();
        }
        self.paths.get(&e.id).cloned().unwrap_or_default()
    }

    fn compute_size(&mut self, e: &X) -> Option<Est> {
        if let Some(s) = self.sizes.get(&e.id) {
            return Some(*s);
        }
        let expr_size = match &e.k {
            K::Lit(Lit::Str(n)) | K::Lit(Lit::Bytes(n)) => Some(*n),
            K::Lit(Lit::Scalar { .. }) => Some(1),
            K::List(l) => Some(l.len() as u64),
            K::Map(m) => Some(m.len() as u64),
            _ => None,
        };
        if let Some(v) = expr_size {
            return Some(fixed(v));
        }
        let path = self.get_path(e).read();
        if let Some(s) = estimate_size(&path) {
            self.sizes.insert(e.id, s);
            return Some(s);
        }
        if is_scalar(&e.ty) {
            return Some(fixed(1));
        }
        if let K::Ident(n) = &e.k
            && let Some(v) = self.peek(n)
            && v.size.is_some()
        {
            return v.size;
        }
        None
    }

    fn compute_entry(&self, e: &X) -> Option<Entry> {
        if let Some(s) = self.entries.get(&e.id) {
            return Some(*s);
        }
        if let K::Ident(n) = &e.k
            && let Some(v) = self.peek(n)
        {
            return v.entry;
        }
        None
    }

    fn size_or_unknown(&mut self, e: &X) -> Est {
        self.compute_size(e).unwrap_or(UNKNOWN)
    }

    fn new_node<'x>(&mut self, e: &'x X) -> Node<'x> {
        let mut path = self.get_path(e);
        if path
            .read()
            .first()
            .is_some_and(|p| p == ACCU || p == HIDDEN_ACCU)
        {
            path = GoPath::default();
        }
        Node {
            path,
            ty: e.ty.clone(),
            expr: Some(e),
            size: self.compute_size(e),
        }
    }

    fn cost(&mut self, e: &X) -> Est {
        match &e.k {
            K::Lit(_) => fixed(0),
            K::Ident(name) => {
                let path = match self.peek(name) {
                    Some(v) => v.path.clone(),
                    None => GoPath::of(vec![name.clone()]),
                };
                self.paths.insert(e.id, path);
                fixed(1)
            }
            K::Select { op, field, test } => {
                if *test {
                    // PresenceTestHasCost(false) in the Kubernetes base environment.
                    return self.cost(op);
                }
                let mut sum = self.cost(op);
                if matches!(
                    op.ty,
                    Type::Map(..)
                        | Type::Device
                        | Type::Quantity
                        | Type::Semver
                        | Type::Url
                        | Type::Format
                ) {
                    sum = sum.add(fixed(1));
                }
                let p = self.get_path(op).append(field);
                self.paths.insert(e.id, p);
                sum
            }
            K::Call { func, target, args } => self.cost_call(e, func, target.as_deref(), args),
            K::List(elems) => {
                let mut sum = fixed(0);
                let mut item = Est {
                    min: u64::MAX,
                    max: 0,
                };
                if elems.is_empty() {
                    item.min = 0;
                }
                for el in elems {
                    sum = sum.add(self.cost(el));
                    let s = self.size_or_unknown(el);
                    item = item.union(s);
                }
                self.entries.insert(
                    e.id,
                    Entry {
                        container: Kind::List,
                        key: fixed(1),
                        val: item,
                    },
                );
                sum.add(fixed(LIST_CREATE))
            }
            K::Map(entries) => {
                let mut sum = fixed(0);
                let mut ks = Est {
                    min: u64::MAX,
                    max: 0,
                };
                let mut vs = ks;
                if entries.is_empty() {
                    ks.min = 0;
                    vs.min = 0;
                }
                for (k, v) in entries {
                    sum = sum.add(self.cost(k));
                    sum = sum.add(self.cost(v));
                    let a = self.size_or_unknown(k);
                    ks = ks.union(a);
                    let b = self.size_or_unknown(v);
                    vs = vs.union(b);
                }
                self.entries.insert(
                    e.id,
                    Entry {
                        container: Kind::Map,
                        key: ks,
                        val: vs,
                    },
                );
                sum.add(fixed(MAP_CREATE))
            }
            K::Struct(fields) => {
                let mut sum = fixed(0);
                for f in fields {
                    sum = sum.add(self.cost(f));
                }
                sum.add(fixed(STRUCT_CREATE))
            }
            K::Comp(c) => {
                let is_bind = matches!(&c.range.k, K::List(l) if l.is_empty())
                    && matches!(&c.cond.k, K::Lit(Lit::Scalar { is_false: true, .. }))
                    && c.accu != ACCU;
                if is_bind {
                    let mut sum = self.cost(&c.range);
                    sum = sum.add(self.cost(&c.init));
                    self.push_local(&c.accu, &c.init);
                    sum = sum.add(self.cost(&c.result));
                    self.pop(&c.accu);
                    if let Some(s) = self.compute_size(&c.result) {
                        self.sizes.insert(e.id, s);
                    }
                    if let Some(en) = self.compute_entry(&c.result) {
                        self.entries.insert(e.id, en);
                    }
                    sum
                } else {
                    self.cost_comprehension(e, c)
                }
            }
        }
    }

    /// Whether the API server types the expression as `any` (an attribute value).
    fn is_any(&self, e: &X) -> bool {
        // With DRAListTypeAttributes attribute values are `dyn` like any other.
        if self.list {
            return false;
        }
        match &e.k {
            K::Comp(c) if c.accu != ACCU => self.is_any(&c.result),
            K::Call { func, args, .. } if func == "_?_:_" && args.len() == 3 => {
                self.is_any(&args[1]) && self.is_any(&args[2])
            }
            _ => wild(&e.ty) && decl_of(&self.get_path(e).read()) == Some(Decl::Attr),
        }
    }

    /// A result type as cel-go's cost environment prints it: attribute values are
    /// `google.protobuf.Any` there, other dynamic values `dyn`.
    fn shown_type(&self, e: &X) -> String {
        if self.is_any(e) {
            return "google.protobuf.Any".into();
        }
        // cel.Type.String() spells null as `null_type`.
        if e.ty == Type::Null {
            return "null_type".into();
        }
        if let K::List(elems) = &e.k
            && let Some(first) = elems.first()
        {
            let shown = self.shown_type(first);
            if elems.iter().all(|el| self.shown_type(el) == shown) {
                return format!("list({shown})");
            }
        }
        match decl_of(&self.get_path(e).read()) {
            Some(Decl::OuterAttrs | Decl::InnerAttrs) if !self.list => {
                e.ty.full_name().replace("dyn", "google.protobuf.Any")
            }
            // cel-go's Type.String(): well-known types by their full names.
            _ => e.ty.full_name(),
        }
    }

    fn push_local(&mut self, name: &str, e: &X) {
        let path = self.get_path(e);
        let entry = self.compute_entry(e);
        let size = self.compute_size(e);
        self.push(name, Local { path, size, entry });
    }

    fn container_of(&self, entry: Option<Entry>, range: &X) -> Kind {
        match entry.map(|e| e.container) {
            Some(k) if k != Kind::Unknown => k,
            _ => match range.ty {
                Type::List(_) => Kind::List,
                Type::Map(..) => Kind::Map,
                _ => Kind::Unknown,
            },
        }
    }

    fn cost_comprehension(&mut self, e: &X, c: &Comp) -> Est {
        let mut sum = self.cost(&c.range);
        // The API server types attribute values as `any`, which cannot be iterated.
        // (With DRAListTypeAttributes they are `dyn`, which can.)
        if !self.list
            && wild(&c.range.ty)
            && decl_of(&self.get_path(&c.range).read()) == Some(Decl::Attr)
        {
            self.error.get_or_insert_with(|| {
                (c.range.id, "expression of type 'any' cannot be range of a comprehension (must be list, map, or dynamic)".into())
            });
        }
        sum = sum.add(self.cost(&c.init));
        self.push_local(&c.accu, &c.init);
        let entry = self.compute_entry(&c.range);
        let container = self.container_of(entry, &c.range);
        let path = self.get_path(&c.range);
        let with = |s: &str| path.append(s);
        if let Some(v2) = &c.iter2 {
            let sub = if container == Kind::List {
                "@indices"
            } else {
                "@keys"
            };
            self.push(
                &c.iter,
                Local {
                    path: with(sub),
                    size: entry.map(|e| e.key),
                    entry: None,
                },
            );
            let sub = if container == Kind::List {
                "@items"
            } else {
                "@values"
            };
            self.push(
                v2,
                Local {
                    path: with(sub),
                    size: entry.map(|e| e.val),
                    entry: None,
                },
            );
        } else {
            let (sub, size) = if container == Kind::List {
                ("@items", entry.map(|e| e.val))
            } else {
                ("@keys", entry.map(|e| e.key))
            };
            self.push(
                &c.iter,
                Local {
                    path: with(sub),
                    size,
                    entry: None,
                },
            );
        }
        let loop_cost = self.cost(&c.cond);
        let step_cost = self.cost(&c.step);
        self.pop(&c.iter);
        if let Some(v2) = &c.iter2 {
            self.pop(v2);
        }
        sum = sum.add(self.cost(&c.result));
        self.pop(&c.accu);
        let range_cnt = self.size_or_unknown(&c.range);
        let per = step_cost.add(loop_cost);
        sum = sum.add(range_cnt.mul(per));
        match &c.init.k {
            K::Lit(_) => {
                if let Some(s) = self.compute_size(&c.init) {
                    self.sizes.insert(e.id, s);
                }
            }
            K::List(_) | K::Map(_) => {
                self.sizes.insert(e.id, range_cnt);
                if let Some(en) = self.compute_entry(&c.step) {
                    self.entries.insert(e.id, en);
                }
            }
            _ => {}
        }
        sum
    }

    fn cost_call(&mut self, e: &X, func: &str, target: Option<&X>, args: &[X]) -> Est {
        if func == "dyn" && args.len() == 1 {
            let c = self.cost(&args[0]);
            if let Some(s) = self.compute_size(&args[0]) {
                self.sizes.insert(e.id, s);
            }
            if let Some(en) = self.compute_entry(&args[0]) {
                self.entries.insert(e.id, en);
            }
            return fixed(1).add(c);
        }
        // DRAListTypeAttributes adds the Kubernetes `includes` library to the environment.
        if func == "includes" && !self.list {
            self.error.get_or_insert_with(|| {
                (
                    e.id,
                    "undeclared reference to 'includes' (in container '')".into(),
                )
            });
        }
        let mut arg_costs = Vec::with_capacity(args.len());
        for a in args {
            arg_costs.push(self.cost(a));
        }
        if func == "format"
            && target.is_some()
            && let Some(K::List(elems)) = args.first().map(|a| &a.k)
            && let Some(el) = elems.iter().find(|el| self.is_any(el))
        {
            self.error.get_or_insert_with(|| {
                        (el.id, "error during formatting: string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given google.protobuf.Any".into())
                    });
        }
        let arg_nodes: Vec<Node> = args.iter().map(|a| self.new_node(a)).collect();
        let ids = overload_ids(func, target, args);
        let mut sum = fixed(0);
        let target_node = match target {
            Some(t) => {
                sum = sum.add(self.cost(t));
                Some(self.new_node(t))
            }
            None => None,
        };
        let mut fn_cost = Est {
            min: u64::MAX,
            max: 0,
        };
        let mut result_size: Option<Est> = None;
        for id in &ids {
            let (c, rs) =
                self.function_cost(e, func, id, target_node.as_ref(), &arg_nodes, &arg_costs);
            fn_cost = fn_cost.union(c);
            if let Some(r) = rs {
                result_size = Some(match result_size {
                    None => r,
                    Some(prev) => prev.union(r),
                });
            }
            if (*id == "index_list" || *id == "index_map") && !args.is_empty() {
                result_size = self.compute_entry(&args[0]).map(|en| en.val);
                let sub = if *id == "index_list" {
                    "@items"
                } else {
                    "@values"
                };
                let p = self.get_path(&args[0]).append(sub);
                self.paths.insert(e.id, p);
            }
            if result_size.is_none() {
                result_size = self.compute_size(e);
            }
        }
        if let Some(r) = result_size {
            self.sizes.insert(e.id, r);
        }
        sum.add(fn_cost)
    }

    /// `sizeEstimate` of Kubernetes' estimator.
    fn k8s_size(&self, n: &Node) -> Est {
        n.size
            .or_else(|| estimate_size(&n.path.read()))
            .unwrap_or(UNKNOWN)
    }

    fn list_element(&self, n: &Node) -> Option<Node<'static>> {
        let p = params(&n.ty);
        let lt = p.first()?;
        let mut path = n.path.read();
        if n.path.arr.is_some() {
            path.push("@items".into());
        }
        Some(Node {
            path: GoPath::of(path),
            ty: lt.clone(),
            expr: None,
            size: None,
        })
    }

    /// Kubernetes' `library.CostEstimator.EstimateCallCost`.
    fn k8s_call(
        &self,
        func: &str,
        id: &str,
        target: Option<&Node>,
        args: &[Node],
    ) -> Option<(Est, Option<Est>)> {
        let one = fixed(1);
        Some(match func {
            "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" | "includes" => {
                let t = target?;
                let mut el_cost = fixed(1);
                if let Some(el) = self.list_element(t) {
                    if matches!(el.ty, Type::String | Type::Bytes) {
                        el_cost = el_cost.add(self.k8s_size(&el).factor(STRING_TRAVERSAL));
                    }
                    (self.k8s_size(t).mul(el_cost), None)
                } else if func == "includes" {
                    (self.k8s_size(t).mul(el_cost), None)
                } else {
                    (self.k8s_size(t).factor(STRING_TRAVERSAL), None)
                }
            }
            "url" | "jsonpatch.escapeKey" if args.len() == 1 => {
                let sz = self.k8s_size(&args[0]);
                (sz.factor(STRING_TRAVERSAL), Some(sz))
            }
            "lowerAscii" | "upperAscii" | "substring" | "trim" => {
                let sz = self.k8s_size(target?);
                (sz.factor(STRING_TRAVERSAL), Some(sz))
            }
            "replace" => {
                let t = target?;
                if args.len() < 2 {
                    return None;
                }
                let sz = self.k8s_size(t);
                let to_replace = self.k8s_size(&args[0]);
                let with = self.k8s_size(&args[1]);
                let (count_max, retained_max) = replace_bound(
                    sz.max,
                    to_replace.min,
                    to_replace.min == 0,
                    with.max <= to_replace.min,
                );
                let (count_min, retained_min) = replace_bound(
                    sz.min,
                    to_replace.max,
                    to_replace.max == 0,
                    to_replace.max <= with.min,
                );
                let count = Est {
                    min: count_min,
                    max: count_max,
                };
                let retained = Est {
                    min: retained_min,
                    max: retained_max,
                };
                let size = count.mul(with).add(retained);
                (sz.factor(2.0 * STRING_TRAVERSAL), Some(size))
            }
            "split" => {
                let sz = self.k8s_size(target?);
                let mut max = sz.max;
                if args.len() > 1
                    && let Some(i) = args[1].expr.and_then(lit_int)
                {
                    max = i as u64;
                }
                (sz.factor(2.0 * STRING_TRAVERSAL), Some(Est { min: 0, max }))
            }
            "join" => {
                let t = target?;
                let mut sz = fixed(0);
                let list = self.k8s_size(t);
                if let Some(el) = self.list_element(t) {
                    sz = list.mul(self.k8s_size(&el));
                }
                if !args.is_empty() {
                    let sep = self.k8s_size(&args[0]);
                    let seps = Est {
                        min: list.min.saturating_sub(1),
                        max: list.max.saturating_sub(1),
                    };
                    sz = sz.add(sep.mul(seps));
                }
                (sz.factor(STRING_TRAVERSAL), Some(sz))
            }
            "find" | "findAll" => {
                let t = target?;
                if args.is_empty() {
                    return None;
                }
                let sz = self.k8s_size(t);
                let s = sz.add(fixed(1)).factor(STRING_TRAVERSAL);
                let r = self.k8s_size(&args[0]).factor(REGEX_LENGTH);
                (
                    s.mul(r),
                    Some(Est {
                        min: 0,
                        max: sz.max,
                    }),
                )
            }
            "cidr" | "isIP" | "isCIDR" | "quantity" | "isQuantity" | "semver" | "isSemver"
                if !args.is_empty() =>
            {
                (self.k8s_size(&args[0]).factor(STRING_TRAVERSAL), None)
            }
            "ip" => {
                if id == "cidr_ip" {
                    (one, None)
                } else if !args.is_empty() {
                    (self.k8s_size(&args[0]).factor(STRING_TRAVERSAL), None)
                } else {
                    return None;
                }
            }
            "ip.isCanonical" if !args.is_empty() => {
                (self.k8s_size(&args[0]).factor(2.0 * STRING_TRAVERSAL), None)
            }
            "masked"
            | "prefixLength"
            | "family"
            | "isUnspecified"
            | "isLoopback"
            | "isLinkLocalMulticast"
            | "isLinkLocalUnicast"
            | "isGlobalUnicast" => (one, None),
            "containsIP" if !args.is_empty() => {
                let sz = Est { min: 4, max: 16 };
                let mut c = sz.add(sz).factor(STRING_TRAVERSAL);
                if id == "cidr_contains_ip_string" {
                    c = c.add(self.k8s_size(&args[0]).factor(STRING_TRAVERSAL));
                }
                (c, None)
            }
            "containsCIDR" if !args.is_empty() => {
                let sz = Est { min: 4, max: 16 };
                let mut c = sz.add(sz).factor(STRING_TRAVERSAL);
                c = c.add(sz.factor(STRING_TRAVERSAL)).add(one);
                if id == "cidr_contains_cidr_string" {
                    c = c.add(self.k8s_size(&args[0]).factor(STRING_TRAVERSAL));
                }
                (c, None)
            }
            "validate" if !args.is_empty() => {
                // cel.MaxNameFormatRegexSize = 128
                let c = self
                    .k8s_size(&args[0])
                    .factor(STRING_TRAVERSAL)
                    .factor(128.0 * REGEX_LENGTH);
                (c, None)
            }
            "format.named" | "sign" | "asInteger" | "isInteger" | "asApproximateFloat"
            | "isGreaterThan" | "isLessThan" | "compareTo" | "add" | "sub" | "major" | "minor"
            | "patch" | "getScheme" | "getHostname" | "getHost" | "getPort" | "getEscapedPath"
            | "getQuery" => (one, None),
            "_==_" if args.len() == 2 => {
                let (l, r) = (&args[0], &args[1]);
                if norm(&l.ty) != norm(&r.ty) {
                    return None;
                }
                match l.ty {
                    Type::Ip | Type::Cidr | Type::Quantity | Type::Semver => (one, None),
                    // cel.MaxFormatSize = 64
                    Type::Format => (Est { min: 1, max: 64 }.factor(STRING_TRAVERSAL), None),
                    Type::Url => {
                        let mut size = fixed(1);
                        if let Some(s) = r.size {
                            size = s.union(s);
                        }
                        (
                            Est {
                                min: 1,
                                max: size.max,
                            }
                            .factor(STRING_TRAVERSAL),
                            None,
                        )
                    }
                    _ => return None,
                }
            }
            _ => return None,
        })
    }

    /// Overload estimators of the cel-go extension libraries (lists v3, sets).
    fn ext_call(
        &self,
        id: &str,
        target: Option<&Node>,
        args: &[Node],
    ) -> Option<(Est, Option<Est>)> {
        let alloc = |factor: f64, size: Est| {
            let c = size.factor(factor).add(fixed(1)).add(fixed(LIST_CREATE));
            (c, Some(size))
        };
        match id {
            "list_slice" => {
                let t = target?;
                if args.len() != 2 {
                    return None;
                }
                let sz = self.k8s_size(t);
                let start = node_as_uint(&args[0], 0);
                let end = node_as_uint(&args[1], sz.max);
                Some(alloc(1.0, fixed(end.wrapping_sub(start))))
            }
            "lists_range" => {
                if target.is_some() || args.len() != 1 {
                    return None;
                }
                Some(alloc(1.0, fixed(node_as_uint(&args[0], u64::MAX))))
            }
            "list_reverse" => {
                let t = target?;
                if !args.is_empty() {
                    return None;
                }
                Some(alloc(1.0, self.k8s_size(t)))
            }
            "list_flatten" | "list_flatten_int" => {
                let t = target?;
                if args.len() > 1 {
                    return None;
                }
                let depth = if args.len() == 1 {
                    node_as_uint(&args[0], u64::MAX)
                } else {
                    1
                };
                Some(alloc(depth as f64, self.k8s_size(t)))
            }
            "list_distinct" => {
                let t = target?;
                if !args.is_empty() {
                    return None;
                }
                let sz = self.k8s_size(t);
                Some(alloc(2.0, sz.mul(sz)))
            }
            "sort_string" | "sort_other" => {
                let t = target?;
                if !args.is_empty() {
                    return None;
                }
                let sz = self.k8s_size(t);
                let f = if id == "sort_string" { 2.1 } else { 2.0 };
                Some(alloc(f, sz.mul(sz)))
            }
            "sortby_string" | "sortby_other" => {
                target?;
                if args.len() != 1 {
                    return None;
                }
                let sz = self.k8s_size(&args[0]);
                let f = if id == "sortby_string" { 2.1 } else { 2.0 };
                Some(alloc(f, sz.mul(sz)))
            }
            "sets_1" | "sets_2" => {
                if args.len() != 2 {
                    return None;
                }
                let a = self.k8s_size(&args[0]);
                let b = self.k8s_size(&args[1]);
                let f = if id == "sets_2" { 2.0 } else { 1.0 };
                Some((a.mul(b).factor(f).add(fixed(1)), None))
            }
            _ => None,
        }
    }

    fn function_cost(
        &mut self,
        e: &X,
        func: &str,
        id: &str,
        target: Option<&Node>,
        args: &[Node],
        arg_costs: &[Est],
    ) -> (Est, Option<Est>) {
        let arg_sum = arg_costs.iter().fold(fixed(0), |a, b| a.add(*b));
        if let Some((c, rs)) = self.ext_call(id, target, args) {
            return (c.add(arg_sum), rs);
        }
        if let Some((c, rs)) = self.k8s_call(func, id, target, args) {
            return (c.add(arg_sum), rs);
        }
        let size_of = |n: &Node| n.size.unwrap_or(UNKNOWN);
        match id {
            "string_format" => {
                if let Some(t) = target {
                    return (size_of(t).factor(STRING_TRAVERSAL).add(arg_sum), None);
                }
            }
            "string_to_bytes" if args.len() == 1 => {
                let sz = size_of(&args[0]);
                return (
                    sz.factor(STRING_TRAVERSAL).add(arg_sum),
                    Some(Est {
                        min: sz.min,
                        max: sz.max.wrapping_mul(4),
                    }),
                );
            }
            "bytes_to_string" if args.len() == 1 => {
                let sz = size_of(&args[0]);
                return (
                    sz.factor(STRING_TRAVERSAL).add(arg_sum),
                    Some(Est {
                        min: sz.min / 4,
                        max: sz.max,
                    }),
                );
            }
            "quote_string" if args.len() == 1 => {
                let sz = size_of(&args[0]);
                return (
                    sz.factor(STRING_TRAVERSAL).add(arg_sum),
                    Some(Est {
                        min: sz.min.wrapping_add(2),
                        max: sz.max.wrapping_mul(2).wrapping_add(2),
                    }),
                );
            }
            "starts_with_string" | "ends_with_string" if args.len() == 1 => {
                return (
                    size_of(&args[0]).factor(STRING_TRAVERSAL).add(arg_sum),
                    None,
                );
            }
            "in_list" if args.len() == 2 => {
                return (size_of(&args[1]).factor(1.0).add(arg_sum), None);
            }
            "matches" | "matches_string" => {
                let pair = if let (Some(t), "matches_string", 1) = (target, id, args.len()) {
                    Some((t, &args[0]))
                } else if id == "matches" && target.is_none() && args.len() == 2 {
                    Some((&args[0], &args[1]))
                } else {
                    None
                };
                if let Some((s, r)) = pair {
                    let sc = size_of(s).add(fixed(1)).factor(STRING_TRAVERSAL);
                    let rc = size_of(r).factor(REGEX_LENGTH);
                    return (sc.mul(rc).add(arg_sum), None);
                }
            }
            "contains_string" => {
                if let (Some(t), 1) = (target, args.len()) {
                    let sc = size_of(t).factor(STRING_TRAVERSAL);
                    let sub = size_of(&args[0]).factor(STRING_TRAVERSAL);
                    return (sc.mul(sub).add(arg_sum), None);
                }
            }
            "logical_or" | "logical_and" => {
                let (l, r) = (arg_costs[0], arg_costs[1]);
                return (
                    Est {
                        min: l.min,
                        max: l.add(r).max,
                    },
                    None,
                );
            }
            "conditional" => {
                let K::Call { args: xs, .. } = &e.k else {
                    unreachable!()
                };
                let size = size_of(&args[1]).union(size_of(&args[2]));
                let en = entry_union(self.compute_entry(&xs[1]), self.compute_entry(&xs[2]));
                if let Some(en) = en {
                    self.entries.insert(e.id, en);
                }
                let c = arg_costs[0].add(arg_costs[1].union(arg_costs[2]));
                return (c, Some(size));
            }
            "add_string" | "add_bytes" | "add_list" if args.len() == 2 => {
                let K::Call { args: xs, .. } = &e.k else {
                    unreachable!()
                };
                let result = size_of(&args[0]).add(size_of(&args[1]));
                let en = entry_union(self.compute_entry(&xs[0]), self.compute_entry(&xs[1]));
                if let Some(en) = en {
                    self.entries.insert(e.id, en);
                }
                if id == "add_list" {
                    return (fixed(1).add(arg_sum), Some(result));
                }
                return (result.factor(STRING_TRAVERSAL).add(arg_sum), Some(result));
            }
            "cmp_string" | "equals" | "not_equals" => {
                let (l, r) = (size_of(&args[0]), size_of(&args[1]));
                let smallest = l.max.min(r.max);
                let min = if smallest > 0 { 1 } else { 0 };
                return (
                    Est { min, max: smallest }
                        .factor(STRING_TRAVERSAL)
                        .add(arg_sum),
                    None,
                );
            }
            _ => {}
        }
        (fixed(1).add(arg_sum), None)
    }
}

/// The overloads cel-go's checker records for a call, reduced to the ones whose cost differs
/// (everything else is "other").
fn overload_ids(func: &str, target: Option<&X>, args: &[X]) -> Vec<&'static str> {
    let t = |i: usize| args.get(i).map(|a| a.ty.clone()).unwrap_or(Type::Dyn);
    let is = |ty: &Type, f: fn(&Type) -> bool| wild(ty) || f(ty);
    let mut ids: Vec<&'static str> = Vec::new();
    let mut other = false;
    match func {
        "_&&_" => ids.push("logical_and"),
        "_||_" => ids.push("logical_or"),
        "_?_:_" => ids.push("conditional"),
        "_==_" => ids.push("equals"),
        "_!=_" => ids.push("not_equals"),
        "@in" => {
            let r = t(1);
            if is(&r, |x| matches!(x, Type::List(_))) {
                ids.push("in_list");
            }
            if is(&r, |x| matches!(x, Type::Map(..))) {
                ids.push("in_map");
            }
        }
        "_[_]" => {
            let l = t(0);
            if is(&l, |x| matches!(x, Type::List(_))) {
                ids.push("index_list");
            }
            if is(&l, |x| matches!(x, Type::Map(..))) {
                ids.push("index_map");
            }
        }
        "matches" => ids.push(if target.is_some() {
            "matches_string"
        } else {
            "matches"
        }),
        "contains" if target.is_some() => ids.push("contains_string"),
        "startsWith" if target.is_some() => ids.push("starts_with_string"),
        "endsWith" if target.is_some() => ids.push("ends_with_string"),
        "_+_" => {
            let (a, b) = (t(0), t(1));
            let both = |f: fn(&Type) -> bool| is(&a, f) && is(&b, f);
            if both(|x| matches!(x, Type::String)) {
                ids.push("add_string");
            }
            if both(|x| matches!(x, Type::Bytes)) {
                ids.push("add_bytes");
            }
            if both(|x| matches!(x, Type::List(_))) {
                ids.push("add_list");
            }
            other = !(matches!(a, Type::String | Type::Bytes | Type::List(_))
                || matches!(b, Type::String | Type::Bytes | Type::List(_)));
        }
        "_<_" | "_<=_" | "_>_" | "_>=_" => {
            let (a, b) = (t(0), t(1));
            let both = |f: fn(&Type) -> bool| is(&a, f) && is(&b, f);
            if both(|x| matches!(x, Type::String)) || both(|x| matches!(x, Type::Bytes)) {
                ids.push("cmp_string");
            }
            other = !(matches!(a, Type::String | Type::Bytes)
                || matches!(b, Type::String | Type::Bytes));
        }
        "string" if target.is_none() && args.len() == 1 => {
            let a = t(0);
            if is(&a, |x| matches!(x, Type::Bytes)) {
                ids.push("bytes_to_string");
            }
            other = !matches!(a, Type::Bytes);
        }
        "bytes" if target.is_none() && args.len() == 1 => {
            let a = t(0);
            if is(&a, |x| matches!(x, Type::String)) {
                ids.push("string_to_bytes");
            }
            other = !matches!(a, Type::String);
        }
        "strings.quote" => ids.push("quote_string"),
        "format" if target.is_some() => ids.push("string_format"),
        "slice" if target.is_some() => ids.push("list_slice"),
        "flatten" if target.is_some() => ids.push(if args.is_empty() {
            "list_flatten"
        } else {
            "list_flatten_int"
        }),
        "lists.range" => ids.push("lists_range"),
        "reverse" if target.is_some() => ids.push("list_reverse"),
        "distinct" if target.is_some() => ids.push("list_distinct"),
        "sort" if let Some(target) = target => {
            let el = elem_of(&target.ty);
            sortable(&el, &mut ids, "sort_string", "sort_other");
        }
        "@sortByAssociatedKeys" if !args.is_empty() => {
            let el = elem_of(&t(0));
            sortable(&el, &mut ids, "sortby_string", "sortby_other");
        }
        "sets.contains" | "sets.intersects" => ids.push("sets_1"),
        "sets.equivalent" => ids.push("sets_2"),
        "ip" if args.len() == 1 && matches!(t(0), Type::Cidr) => ids.push("cidr_ip"),
        "containsIP" if args.len() == 1 && !matches!(t(0), Type::Ip) => {
            ids.push("cidr_contains_ip_string")
        }
        "containsCIDR" if args.len() == 1 && !matches!(t(0), Type::Cidr) => {
            ids.push("cidr_contains_cidr_string")
        }
        _ => other = true,
    }
    if other || ids.is_empty() {
        ids.push("other");
    }
    ids
}

/// One bound of Kubernetes' `replace` size estimate: (replacements, retained size).
fn replace_bound(size: u64, needle: u64, empty_needle: bool, no_growth: bool) -> (u64, u64) {
    if empty_needle {
        (size.saturating_add(1), size)
    } else if no_growth {
        (0, size)
    } else {
        ((size as f64 / needle as f64).ceil() as u64, 0)
    }
}

fn sortable(el: &Type, ids: &mut Vec<&'static str>, s: &'static str, o: &'static str) {
    if wild(el) {
        ids.push(o);
        ids.push(s);
    } else if matches!(el, Type::String | Type::Bytes) {
        ids.push(s);
    } else {
        ids.push(o);
    }
}

/// The attributes map as the evaluation environment types it, and as the cost environment does.
const ATTRIBUTES_DYN: &str = "map(string, map(string, dyn))";
const ATTRIBUTES_ANY: &str = "map(string, map(string, any))";

/// The feature gates kube-apiserver's NewExpressions environment depends on (`cel.Features`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CostFeatures {
    /// DRAListTypeAttributes (alpha, off by default).
    pub list_type_attributes: bool,
    /// DRAConsumableCapacity (beta, on by default): declares `device.allowMultipleAllocations`.
    pub consumable_capacity: bool,
}

impl Default for CostFeatures {
    /// Kubernetes 1.37's defaults.
    fn default() -> Self {
        CostFeatures {
            list_type_attributes: false,
            consumable_capacity: true,
        }
    }
}

/// The worst-case cost kube-apiserver estimates for a selector (`CompilationResult.MaxCost`
/// in the NewExpressions environment); validation rejects it above [`super::MAX_COST`].
pub fn estimate_cost(expression: &str) -> Result<u64, CelError> {
    estimate_cost_with(expression, CostFeatures::default())
}

/// [`estimate_cost`] for an API server with these gates.
pub fn estimate_cost_with(expression: &str, features: CostFeatures) -> Result<u64, CelError> {
    let source = expression.to_string();
    super::on_compile_thread(move || estimate_on_this_thread(&source, features, false))
}

/// The worst-case cost kube-apiserver estimates for a new derived attribute's expression
/// (`derivedAttributes[].expression`, compiled as one: a scalar, or a list with
/// DRAListTypeAttributes); validation rejects it above [`super::MAX_COST`], and a claim whose
/// expressions add up to more than that.
pub fn estimate_derived_cost_with(
    expression: &str,
    features: CostFeatures,
) -> Result<u64, CelError> {
    let source = expression.to_string();
    super::on_compile_thread(move || estimate_on_this_thread(&source, features, true))
}

fn estimate_on_this_thread(
    source: &str,
    features: CostFeatures,
    derived: bool,
) -> Result<u64, CelError> {
    // Same parse and check as `compile` (its errors are the API server's too, but for the type
    // of attribute values, which this environment declares `any`).
    // A result that is not a selector's is reported below, in this environment's type names.
    let environment = super::Features {
        consumable_capacity: features.consumable_capacity,
    };
    // A derived attribute of the wrong type is reported after the type checker's errors, which
    // the cost pass below finds in this environment's types.
    let mut derived_output_error = None;
    if derived {
        let compiled = super::compile_derived(
            source,
            environment,
            features.list_type_attributes,
            features.list_type_attributes,
        );
        match compiled {
            Ok(_) => {}
            Err(CelError::Compile(m)) if m.starts_with("must evaluate to a primitive scalar") => {
                derived_output_error = Some(m);
            }
            Err(CelError::Compile(m)) if features.list_type_attributes => {
                return Err(CelError::Compile(m));
            }
            Err(CelError::Compile(m)) => {
                return Err(CelError::Compile(m.replace(ATTRIBUTES_DYN, ATTRIBUTES_ANY)));
            }
            Err(e) => return Err(e),
        }
    }
    let wrong_output = if derived {
        false
    } else {
        match super::compile_with(source, environment) {
            Ok(_) => false,
            Err(CelError::Compile(m)) if m.starts_with("must evaluate to bool") => true,
            Err(CelError::Compile(m)) if features.list_type_attributes => {
                return Err(CelError::Compile(m));
            }
            Err(CelError::Compile(m)) => {
                return Err(CelError::Compile(m.replace(ATTRIBUTES_DYN, ATTRIBUTES_ANY)));
            }
            Err(e) => return Err(e),
        }
    };
    let (ast, info) = super::parser()
        .parse_with_source_info(source)
        .map_err(|_| CelError::Compile("compilation failed".into()))?;
    let mut checker = Checker::new(&info);
    let (_, root_ty) = checker.check_root(&ast);
    let mut b = Builder {
        types: &checker.types,
        next_id: 1 << 48,
        locals: Vec::new(),
        var_types: Vec::new(),
    };
    let root = b.build(&ast);
    let mut c = Coster {
        paths: HashMap::new(),
        locals: HashMap::new(),
        sizes: HashMap::new(),
        entries: HashMap::new(),
        error: None,
        list: features.list_type_attributes,
    };
    let cost = c.cost(&root);
    if let Some((id, e)) = c.error {
        let (line, col) = info
            .offset_for(id)
            .map(|(start, _)| super::line_col(source, start))
            .unwrap_or((1, 1));
        return Err(CelError::Compile(format!(
            "compilation failed: {}",
            super::format_issue(source, line, col, &e)
        )));
    }
    if let Some(message) = derived_output_error {
        // Without DRAListTypeAttributes attribute values are `Any`, in what the type is shown as.
        return Err(CelError::Compile(match message.split_once(", not ") {
            Some((wanted, _)) if !features.list_type_attributes => {
                format!("{wanted}, not {}", c.shown_type(&root))
            }
            _ => message,
        }));
    }
    if derived {
        return Ok(cost.max);
    }
    // The API server's attribute type is `any`: other dynamic results are not selectors.
    // With DRAListTypeAttributes the attribute type is `dyn`: every dynamic result passes.
    let rejected = if features.list_type_attributes {
        wrong_output && !wild(&root_ty)
    } else {
        wrong_output || (wild(&root_ty) && !c.is_any(&root))
    };
    if rejected {
        return Err(CelError::Compile(format!(
            "must evaluate to bool or the unknown type, not {}",
            c.shown_type(&root)
        )));
    }
    Ok(cost.max)
}
