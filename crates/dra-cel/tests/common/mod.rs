//! What the differentials compare of an error: its kind and the message's first line (cel-go
//! appends a caret picture of the source, and Go's regexp library its own detail).
use serde_json::{Value as Json, json};

pub fn normalise(v: &Json) -> Json {
    let Some(err) = v.get("error") else {
        return v.clone();
    };
    let kind = err["kind"].as_str().unwrap_or_default();
    let mut msg = err["message"].as_str().unwrap_or_default().to_string();
    if kind == "compile" && msg.starts_with("compilation failed: ") {
        msg = msg.lines().next().unwrap_or_default().to_string();
    }
    if let Some(pos) = msg.find("error parsing regexp:") {
        msg.truncate(pos + "error parsing regexp:".len());
    }
    json!({"kind": kind, "message": msg})
}
