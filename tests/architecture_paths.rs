//! `ARCHITECTURE.md` names files and folders in backticks for readers to open; this holds every
//! such path to the tree, so a rename or removal that leaves the codemap stale fails here, naming
//! each path that no longer exists.
//!
//! A path is a word inside a `code span` that starts with one of the repository's top-level
//! folders (`src/`, `crates/`, `e2e/`, ...) or is a root file (`Cargo.toml`, `README.md`, ...).
//! A trailing `:line` or `::item` is dropped (`src/prepare/state.rs:614`,
//! `src/slices/mod.rs::build`), and so is trailing punctuation. Words with placeholders or
//! globs (`e2e/<name>.sh`, `tests/cli_*.rs`) describe many paths and are not checked.
use std::collections::BTreeSet;
use std::path::Path;

const PREFIXES: &[&str] = &[
    "src/",
    "crates/",
    "e2e/",
    "proto/",
    "deploy/",
    "deviceclasses/",
    "tests/",
    "benches/",
    "docs/",
    ".ci/",
];

const ROOT_FILES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "README.md",
    "ARCHITECTURE.md",
    "build.rs",
    ".gitignore",
];

/// The contents of the inline code spans of one line (single backticks; fenced blocks are
/// skipped by the caller).
fn code_spans(line: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else {
            break;
        };
        spans.push(&after[..close]);
        rest = &after[close + 1..];
    }
    spans
}

/// The repository path a word names, if it names one.
fn as_path(word: &str) -> Option<String> {
    let word = word.trim_matches(|c: char| matches!(c, '(' | ')' | ',' | ';' | '"' | '\''));
    if word.contains(['*', '<', '>', '{', '}', '$', '[', ']', '=']) {
        return None;
    }
    let is_path = PREFIXES.iter().any(|p| word.starts_with(p))
        || ROOT_FILES
            .iter()
            .any(|f| word == *f || word.strip_prefix(f).is_some_and(|s| s.starts_with(':')));
    if !is_path {
        return None;
    }
    // `path::item`, then `path:line` (or `path:line:column`).
    let mut path = word.split("::").next().unwrap_or(word);
    if let Some((head, tail)) = path.split_once(':')
        && tail
            .split(':')
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    {
        path = head;
    }
    let path = path.trim_end_matches(['.', ':']);
    (!path.is_empty()).then(|| path.to_string())
}

/// Lines (1-based) outside fenced blocks with an odd number of backticks: a code span split
/// across lines, whose paths would go unchecked.
fn unbalanced_lines(markdown: &str) -> Vec<usize> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.matches('`').count() % 2 == 1 {
            lines.push(index + 1);
        }
    }
    lines
}

fn paths_in(markdown: &str) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for span in code_spans(line) {
            paths.extend(span.split_whitespace().filter_map(as_path));
        }
    }
    paths
}

#[test]
fn every_path_architecture_md_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = root.join("ARCHITECTURE.md");
    let markdown = std::fs::read_to_string(&doc)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", doc.display()));
    let unbalanced = unbalanced_lines(&markdown);
    assert!(
        unbalanced.is_empty(),
        "ARCHITECTURE.md lines {unbalanced:?} split a `code span` across lines; keep each on one line so its paths are checked"
    );
    let paths = paths_in(&markdown);
    eprintln!("ARCHITECTURE.md: {} repository paths checked", paths.len());
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !root.join(p.trim_end_matches('/')).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names {} path(s) that do not exist (of {} checked):\n  {}",
        missing.len(),
        paths.len(),
        missing
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    assert!(
        paths.len() >= 40,
        "ARCHITECTURE.md names only {} repository paths in backticks; a codemap names far more (emptied or reformatted?)",
        paths.len()
    );
}

#[test]
fn paths_are_recognised_as_the_codemap_writes_them() {
    let found = paths_in(
        "See `src/prepare/state.rs:614`, `src/slices/mod.rs::build` and `e2e/cluster up`.\n\
         Not `e2e/<name>.sh`, `tests/cli_*.rs`, `NodeDriver` or `gpu.nvidia.com`; \
         `Cargo.toml`, `deploy/helm/gpu-dra/`.\n\
         ```\n`src/in/a/fence.rs`\n```\n",
    );
    let expected: BTreeSet<String> = [
        "src/prepare/state.rs",
        "src/slices/mod.rs",
        "e2e/cluster",
        "Cargo.toml",
        "deploy/helm/gpu-dra/",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, expected);
    assert_eq!(
        unbalanced_lines("`a` and `b\nc` d\n```\n`\n```\n"),
        vec![1, 2]
    );
}
