//! What the differentials compare of an error: its kind and the message's first line (cel-go
//! appends a caret picture of the source, and Go's regexp library its own detail).
use serde_json::{Value as Json, json};

mod report;
pub use report::report;

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

/// `K8S_FEATURE_GATES` of e2e/versions.env: the gates the e2e cluster's components run with.
pub fn cluster_gates() -> String {
    include_str!("../../../../e2e/versions.env")
        .lines()
        .find_map(|l| l.strip_prefix("K8S_FEATURE_GATES="))
        .expect("K8S_FEATURE_GATES in e2e/versions.env")
        .trim()
        .to_string()
}

/// Runs `$CEL_ORACLE ARGS` with one JSON input per line and returns its one answer per line.
pub fn ask_oracle<T: std::fmt::Display>(args: &[String], lines: &[T]) -> Vec<Json> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let oracle = std::env::var("CEL_ORACLE").expect(
        "CEL_ORACLE is not set: build e2e/harness/cmd/cel-oracle and point CEL_ORACLE at it",
    );
    let mut child = Command::new(&oracle)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {oracle}: {e}"));
    let mut stdin = child.stdin.take().expect("oracle stdin");
    let payload: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let writer = std::thread::spawn(move || stdin.write_all(payload.as_bytes()));
    let answers: Vec<Json> = BufReader::new(child.stdout.take().expect("oracle stdout"))
        .lines()
        .map(|l| serde_json::from_str(&l.expect("oracle line")).expect("oracle json"))
        .collect();
    writer.join().expect("writer").expect("write to oracle");
    assert!(child.wait().expect("oracle exit").success());
    assert_eq!(answers.len(), lines.len(), "oracle answered every line");
    answers
}
