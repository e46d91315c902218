//! RE2 patterns on the Rust `regex` crate. RE2's Perl classes (`\d \w \s \b`) are ASCII-only
//! while Rust's are Unicode-aware, so they are rewritten to explicit ASCII classes first.
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use regex::Regex;

/// Rewrites the RE2-only and Unicode-sensitive escapes of `pattern`.
fn translate(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(next) = chars.next() else {
                    out.push('\\');
                    break;
                };
                let (outside, inside) = match next {
                    'd' => ("[0-9]", "0-9"),
                    'D' => ("[^0-9]", ""),
                    'w' => ("[0-9A-Za-z_]", "0-9A-Za-z_"),
                    'W' => ("[^0-9A-Za-z_]", ""),
                    's' => ("[\\t\\n\\f\\r ]", "\\t\\n\\f\\r "),
                    'S' => ("[^\\t\\n\\f\\r ]", ""),
                    'b' if !in_class => ("(?-u:\\b)", ""),
                    'B' if !in_class => ("(?-u:\\B)", ""),
                    _ => ("", ""),
                };
                if in_class && !inside.is_empty() {
                    out.push_str(inside);
                } else if !in_class && !outside.is_empty() {
                    out.push_str(outside);
                } else {
                    out.push('\\');
                    out.push(next);
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                // A leading `]` or `^]` is literal inside a class.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str("\\]");
                    chars.next();
                }
            }
            '[' if in_class => {
                // POSIX classes like [[:alpha:]] stay as they are.
                out.push('[');
                if chars.peek() == Some(&':') {
                    for c2 in chars.by_ref() {
                        out.push(c2);
                        if c2 == ']' {
                            break;
                        }
                    }
                }
            }
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            c => out.push(c),
        }
    }
    out
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("error parsing regexp: {0}")]
pub struct RegexError(pub String);

/// Compiles an RE2 pattern.
pub fn compile(pattern: &str) -> Result<Regex, RegexError> {
    Regex::new(&translate(pattern)).map_err(|e| RegexError(e.to_string()))
}

thread_local! {
    static CACHE: RefCell<HashMap<String, Result<Arc<Regex>, RegexError>>> = RefCell::new(HashMap::new());
}

/// Compiles with a small per-thread cache (patterns computed at run time).
pub fn cached(pattern: &str) -> Result<Arc<Regex>, RegexError> {
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some(r) = cache.get(pattern) {
            return r.clone();
        }
        if cache.len() > 256 {
            cache.clear();
        }
        let compiled = compile(pattern).map(Arc::new);
        cache.insert(pattern.to_string(), compiled.clone());
        compiled
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perl_classes_are_ascii() {
        let digit = compile("^\\d$").unwrap();
        assert!(digit.is_match("7"));
        assert!(!digit.is_match("١"));
        assert!(compile("^[\\w-]+$").unwrap().is_match("a_b-c"));
        assert!(!compile("^\\w$").unwrap().is_match("é"));
        assert!(compile("[").is_err());
        assert!(compile("[]a]").unwrap().is_match("]"));
    }
}
