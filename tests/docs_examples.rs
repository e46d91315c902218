//! Every fenced code block of the guide (README.md and `docs/**/*.md`) is an example the suite
//! runs, so the guide cannot drift from what gpu-dra does:
//!
//! - ` ```console ` blocks are run: a line `$ CMD` is a command (`sh -c` from the repository root,
//!   `gpu-dra` the binary under test first on PATH, a fresh folder per block as `$TMP` and
//!   `$TMPDIR`; a line ending in `\` continues on the next). The lines after it, up to the next
//!   `$ ` or the block's end, are its stdout, compared exactly except for trycmd's wildcards: a
//!   line `...` stands for any lines, `[..]` for any text within a line. A command must exit 0
//!   unless the info string says otherwise (` ```console,exit=3 `).
//! - ` ```yaml ` (and ` ```json `) blocks: every document parses. Blocks of Kubernetes objects go
//!   through `gpu-dra match` on a simulated fleet, with a claim on every DeviceClass they define
//!   (and one on `gpu.nvidia.com`) so that there is always something to allocate: a claim that
//!   does not fit is fine, a refusal of the input (exit 2: a field the API server or Kueue would
//!   reject, a CEL expression that does not compile) is not. Documents without `kind` are chart
//!   values: every key must be one of `deploy/helm/gpu-dra/values.yaml`.
//! - Any block may carry a marker on the line before it instead:
//!   `<!-- example: not run (REASON) -->`, where REASON names the script or test that runs the
//!   equivalent (on a cluster, a GPU, or too slowly for this test), and every path it names must
//!   exist; or `<!-- example: part of FILE -->` for a YAML fragment, which must then be found,
//!   value for value, in FILE (itself run through `match`).
//! - Other blocks (` ```sh `, ` ```promql `, ...) must carry a `not run` marker.
//!
//! The run prints `docs examples: ...` with what it checked (and appends it to
//! `$GPU_DRA_TEST_REPORT`, whose lines `e2e/run-tests` checks).
#![cfg(feature = "tools")]

#[path = "common/docs.rs"]
mod docs;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize as _;
use serde_json::Value;

const GPU_DRA: &str = env!("CARGO_BIN_EXE_gpu-dra");

/// The fleet YAML blocks are matched against: whole GPUs with MIG (dynamic), and one without.
const FLEET: &str = "sim:8xH100-SXM5-80GB,1xT4";

/// Environment variables gpu-dra reads as flag defaults: a developer's shell (or a CI job) that
/// sets one would change an example's output, so commands run without them.
const DRIVER_ENV: &[&str] = &[
    "ADDITIONAL_XIDS_TO_IGNORE",
    "CONTAINER_DRIVER_ROOT",
    "GPU_CLIQUE_LABEL_ENABLED",
    "KUBECONFIG",
    "KUBECONFIG_PATH",
    "KUBELET_PLUGINS_DIRECTORY_PATH",
    "NODE_NAME",
    "NVIDIA_CDI_HOOK_PATH",
    "NVIDIA_DRIVER_ROOT",
    "RUST_LOG",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, then `docs/` recursively, sorted.
fn doc_files() -> Vec<PathBuf> {
    docs::markdown_files(&root(), &["README.md"])
}

enum Marker {
    /// `<!-- example: not run (REASON) -->`
    NotRun(String),
    /// `<!-- example: part of FILE -->`
    PartOf(String),
}

struct Block {
    /// `README.md:80`: the opening fence.
    at: String,
    /// The info string's language (`console`, `yaml`, ...), then its options (`exit=3`).
    lang: String,
    options: Vec<String>,
    /// The block's lines, without the fence's indentation (blocks inside list items).
    lines: Vec<String>,
    marker: Option<Marker>,
}

fn parse_marker(line: &str, at: &str) -> Option<Marker> {
    let inner = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim()
        .strip_prefix("example:")?
        .trim();
    if let Some(reason) = inner
        .strip_prefix("not run (")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        return Some(Marker::NotRun(reason.to_string()));
    }
    if let Some(file) = inner.strip_prefix("part of ") {
        return Some(Marker::PartOf(file.trim().to_string()));
    }
    panic!(
        "{at}: marker `{}` is neither `example: not run (REASON)` nor `example: part of FILE`",
        line.trim()
    );
}

fn blocks_of(path: &Path) -> Vec<Block> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = path
        .strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let indent = lines[i].len() - lines[i].trim_start().len();
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let at = format!("{name}:{}", i + 1);
        let mut parts = info.trim().split(',').map(|p| p.trim().to_string());
        let lang = parts.next().unwrap_or_default();
        let options = parts.collect();
        let marker = i
            .checked_sub(1)
            .and_then(|before| parse_marker(lines[before], &at));
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != "```" {
            // Lines of a block in a list item carry the item's indentation.
            let line = lines[i];
            let strip = indent.min(line.len() - line.trim_start().len());
            body.push(line[strip..].to_string());
            i += 1;
        }
        assert!(i < lines.len(), "{at}: the block is never closed");
        i += 1;
        blocks.push(Block {
            at,
            lang,
            options,
            lines: body,
            marker,
        });
    }
    blocks
}

/// trycmd's `[..]`: any text within a line.
fn line_matches(pattern: &str, text: &str) -> bool {
    docs::wildcard_matches(pattern, "[..]", text)
}

/// Whether `actual` is `expected` with its wildcards: `...` lines stand for any lines.
fn output_matches(expected: &[String], actual: &[&str]) -> bool {
    fn go(
        e: &[String],
        a: &[&str],
        i: usize,
        j: usize,
        memo: &mut HashMap<(usize, usize), bool>,
    ) -> bool {
        if let Some(&known) = memo.get(&(i, j)) {
            return known;
        }
        let result = if i == e.len() {
            j == a.len()
        } else if e[i] == "..." {
            go(e, a, i + 1, j, memo) || (j < a.len() && go(e, a, i, j + 1, memo))
        } else {
            j < a.len() && line_matches(&e[i], a[j]) && go(e, a, i + 1, j + 1, memo)
        };
        memo.insert((i, j), result);
        result
    }
    go(expected, actual, 0, 0, &mut HashMap::new())
}

/// A line diff (`-` expected, `+` actual) by longest common subsequence under the wildcards; the
/// actual lines a `...` absorbs are summarized, not listed.
fn diff(expected: &[String], actual: &[&str]) -> String {
    let (n, m) = (expected.len(), actual.len());
    let same = |i: usize, j: usize| expected[i] != "..." && line_matches(&expected[i], actual[j]);
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if same(i, j) {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // Runs of edits between matched lines, each rendered as a whole.
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    let mut gap_minus: Vec<&str> = Vec::new();
    let mut gap_plus: Vec<&str> = Vec::new();
    let flush = |out: &mut Vec<String>, minus: &mut Vec<&str>, plus: &mut Vec<&str>| {
        let wildcard = minus.contains(&"...");
        for line in minus.drain(..) {
            if line == "..." {
                out.push(format!("  ... ({} lines)", plus.len()));
            } else {
                out.push(format!("- {line}"));
            }
        }
        if !wildcard {
            out.extend(plus.iter().map(|line| format!("+ {line}")));
        }
        plus.clear();
    };
    while i < n || j < m {
        if i < n && j < m && same(i, j) {
            flush(&mut out, &mut gap_minus, &mut gap_plus);
            out.push(format!("  {}", actual[j]));
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            gap_plus.push(actual[j]);
            j += 1;
        } else {
            gap_minus.push(&expected[i]);
            i += 1;
        }
    }
    flush(&mut out, &mut gap_minus, &mut gap_plus);
    const MAX: usize = 80;
    if out.len() > MAX {
        let more = out.len() - MAX;
        out.truncate(MAX);
        out.push(format!("  [{more} more lines]"));
    }
    out.join("\n")
}

struct Run {
    root: PathBuf,
    path: String,
    commands: usize,
    manifests: usize,
    not_run: usize,
    failures: Vec<String>,
    values: Value,
}

impl Run {
    fn command(&self, script: &str, tmp: &Path) -> Output {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(script)
            .current_dir(&self.root)
            .env("PATH", &self.path)
            .env("TMP", tmp)
            .env("TMPDIR", tmp);
        for (name, _) in std::env::vars_os() {
            let text = name.to_string_lossy();
            if text.starts_with("GPU_DRA_") || DRIVER_ENV.contains(&text.as_ref()) {
                command.env_remove(&name);
            }
        }
        command
            .output()
            .unwrap_or_else(|e| panic!("sh -c {script:?}: {e}"))
    }

    /// A `not run` marker's reason must name the scripts or tests that run the block's
    /// equivalent, and they must exist (a renamed script leaves no dangling excuse).
    fn check_reason(&mut self, block: &Block, reason: &str) {
        let paths: Vec<&str> = reason
            .split(|c: char| c.is_whitespace() || ",;()`".contains(c))
            .map(|word| word.trim_end_matches(['.', ':']))
            .filter(|word| word.contains('/') && !word.contains("://"))
            .collect();
        if paths.is_empty() {
            self.failures.push(format!(
                "{}: `not run ({reason})` names no script or test that runs it",
                block.at
            ));
        }
        for path in paths {
            if !self.root.join(path).exists() {
                self.failures.push(format!(
                    "{}: `not run ({reason})` names {path}, which does not exist",
                    block.at
                ));
            }
        }
    }

    fn console(&mut self, block: &Block) {
        let mut exit = 0;
        for option in &block.options {
            match option.strip_prefix("exit=").map(str::parse::<i32>) {
                Some(Ok(code)) => exit = code,
                _ => self
                    .failures
                    .push(format!("{}: unknown option `{option}`", block.at)),
            }
        }
        let tmp = tempfile::tempdir().expect("a temp dir");
        let mut lines = block.lines.iter().peekable();
        let mut ran = 0;
        while let Some(line) = lines.next() {
            let Some(first) = line.strip_prefix("$ ") else {
                self.failures.push(format!(
                    "{}: `{line}` is neither a command (`$ `) nor a command's output",
                    block.at
                ));
                return;
            };
            let mut script = first.to_string();
            while script.ends_with('\\') {
                match lines.next() {
                    Some(more) => {
                        script.push('\n');
                        script.push_str(more);
                    }
                    None => break,
                }
            }
            let mut expected = Vec::new();
            while let Some(next) = lines.next_if(|l| !l.starts_with("$ ")) {
                expected.push(next.clone());
            }
            let out = self.command(&script, tmp.path());
            ran += 1;
            self.commands += 1;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let actual: Vec<&str> = stdout.lines().collect();
            let code = out.status.code();
            if code != Some(exit) {
                self.failures.push(format!(
                    "{}: `{script}` exited {code:?}, the block expects {exit}\nstderr:\n{stderr}",
                    block.at
                ));
            } else if !output_matches(&expected, &actual) {
                self.failures.push(format!(
                    "{}: `{script}`: stdout drifted (- the guide, + now)\n{}\nstderr:\n{stderr}",
                    block.at,
                    diff(&expected, &actual)
                ));
            }
        }
        if ran == 0 {
            self.failures
                .push(format!("{}: a console block without a command", block.at));
        }
    }

    fn documents(&mut self, block: &Block, text: &str) -> Option<Vec<Value>> {
        let mut docs = Vec::new();
        for (n, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            match Value::deserialize(doc) {
                Ok(Value::Null) => {}
                Ok(value) => docs.push(value),
                Err(e) => {
                    self.failures.push(format!(
                        "{}: document {} does not parse: {e}",
                        block.at,
                        n + 1
                    ));
                    return None;
                }
            }
        }
        Some(docs)
    }

    /// `gpu-dra match` on the file with a claim on each of `classes`: refused input (exit 2)
    /// fails the block.
    fn matched(&mut self, at: &str, file: &Path, classes: &[String]) {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let claims: Vec<String> = classes
            .iter()
            .enumerate()
            .map(|(n, class)| {
                format!(
                    "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n\
                     metadata: {{name: docs-example-{n}}}\n\
                     spec: {{devices: {{requests: [{{name: r, exactly: {{deviceClassName: {class:?}}}}}]}}}}\n"
                )
            })
            .collect();
        let extra = tmp.path().join("claims.yaml");
        fs::write(&extra, claims.join("---\n")).expect("writes the claims");
        let out = Command::new(GPU_DRA)
            .current_dir(&self.root)
            .args([
                "match",
                "--slices",
                FLEET,
                "--classes",
                "deviceclasses/",
                "-f",
            ])
            .arg(file)
            .arg("-f")
            .arg(&extra)
            .output()
            .expect("runs gpu-dra match");
        if !matches!(out.status.code(), Some(0 | 1 | 3)) {
            self.failures.push(format!(
                "{at}: gpu-dra match --slices {FLEET} refuses it ({:?}):\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }

    fn yaml(&mut self, block: &Block) {
        let text = block.lines.join("\n") + "\n";
        let Some(docs) = self.documents(block, &text) else {
            return;
        };
        if docs.is_empty() {
            self.failures
                .push(format!("{}: a YAML block without a document", block.at));
            return;
        }
        self.manifests += docs.len();
        if let Some(Marker::PartOf(file)) = &block.marker {
            let path = self.root.join(file);
            let Ok(whole) = fs::read_to_string(&path) else {
                self.failures.push(format!(
                    "{}: part of {file}, which cannot be read",
                    block.at
                ));
                return;
            };
            let Some(objects) = self.documents(block, &whole) else {
                return;
            };
            for doc in &docs {
                if !objects.iter().any(|object| contains(object, doc)) {
                    self.failures.push(format!(
                        "{}: the fragment is not in {file}: {doc}",
                        block.at
                    ));
                }
            }
            self.matched(&block.at, &path, &["gpu.nvidia.com".to_string()]);
            return;
        }
        let objects: Vec<&Value> = docs.iter().filter(|d| d.get("kind").is_some()).collect();
        for doc in docs.iter().filter(|d| d.get("kind").is_none()) {
            let mut unknown = Vec::new();
            values_keys(doc, &self.values, "", &mut unknown);
            for key in unknown {
                self.failures.push(format!(
                    "{}: `{key}` is not a value of deploy/helm/gpu-dra/values.yaml (no `kind`: read as chart values)",
                    block.at
                ));
            }
        }
        if objects.is_empty() {
            return;
        }
        let mut classes = vec!["gpu.nvidia.com".to_string()];
        classes.extend(
            objects
                .iter()
                .filter(|o| o["kind"] == "DeviceClass")
                .filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str))
                .map(str::to_string),
        );
        let tmp = tempfile::tempdir().expect("a temp dir");
        let file = tmp.path().join("block.yaml");
        fs::write(&file, &text).expect("writes the block");
        self.matched(&block.at, &file, &classes);
    }
}

/// Whether `needle` (a mapping) is found in `haystack`: some mapping in it holds each of the
/// needle's keys with an equal value.
fn contains(haystack: &Value, needle: &Value) -> bool {
    if let (Value::Object(have), Value::Object(want)) = (haystack, needle)
        && want.iter().all(|(k, v)| have.get(k) == Some(v))
    {
        return true;
    }
    match haystack {
        Value::Object(fields) => fields.values().any(|v| contains(v, needle)),
        Value::Array(items) => items.iter().any(|v| contains(v, needle)),
        _ => false,
    }
}

/// The keys of `doc` that `values` lacks, as dotted paths. Below a value that is not a mapping
/// with keys (a list, `{}` for free-form maps such as `nodeSelector`), anything goes.
fn values_keys(doc: &Value, values: &Value, path: &str, unknown: &mut Vec<String>) {
    let (Value::Object(doc), Value::Object(values)) = (doc, values) else {
        return;
    };
    if values.is_empty() {
        return;
    }
    for (key, value) in doc {
        let at = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        match values.get(key) {
            Some(known) => values_keys(value, known, &at, unknown),
            None => unknown.push(at),
        }
    }
}

/// Prints the count line and appends it to `$GPU_DRA_TEST_REPORT` when set (e2e/run-tests ends
/// with those lines).
fn report(line: &str) {
    use std::io::Write as _;
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("GPU_DRA_TEST_REPORT") {
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("GPU_DRA_TEST_REPORT {path:?}: {e}"));
        writeln!(file, "{line}").unwrap_or_else(|e| panic!("GPU_DRA_TEST_REPORT {path:?}: {e}"));
    }
}

#[test]
fn every_example_in_the_guide_runs() {
    let root = root();
    let bin_dir = Path::new(GPU_DRA)
        .parent()
        .expect("the binary has a folder");
    let mut path = bin_dir.as_os_str().to_owned();
    if let Some(rest) = std::env::var_os("PATH") {
        path.push(":");
        path.push(rest);
    }
    let values_text = fs::read_to_string(root.join("deploy/helm/gpu-dra/values.yaml"))
        .expect("reads the chart's values.yaml");
    let values: Value = serde_yaml_ng::from_str(&values_text).expect("values.yaml parses");
    let mut run = Run {
        path: path.to_string_lossy().into_owned(),
        root,
        commands: 0,
        manifests: 0,
        not_run: 0,
        failures: Vec::new(),
        values,
    };
    for file in doc_files() {
        for block in blocks_of(&file) {
            if let Some(Marker::NotRun(reason)) = &block.marker {
                run.check_reason(&block, reason);
                run.not_run += 1;
                continue;
            }
            match block.lang.as_str() {
                "console" => run.console(&block),
                "yaml" | "yml" | "json" => run.yaml(&block),
                lang => run.failures.push(format!(
                    "{}: a ```{lang} block is neither run (```console, ```yaml, ```json) nor marked \
                     `<!-- example: not run (the script or test that runs it) -->`",
                    block.at
                )),
            }
        }
    }
    if run.commands == 0 || run.manifests == 0 {
        run.failures.push(format!(
            "{} commands and {} manifests found: is the guide still in README.md and docs/?",
            run.commands, run.manifests
        ));
    }
    report(&format!(
        "docs examples: {} commands, {} manifests checked, {} mismatches ({} blocks not run, each naming its test)",
        run.commands,
        run.manifests,
        run.failures.len(),
        run.not_run
    ));
    assert!(
        run.failures.is_empty(),
        "{} example(s) of the guide drifted:\n\n{}",
        run.failures.len(),
        run.failures.join("\n\n")
    );
}
