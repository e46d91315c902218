//! What the documentation tests share: the guide's files, and trycmd-style wildcard matching.
//! Included by path (`#[path = "common/docs.rs"]`) so each test takes only this.
use std::fs;
use std::path::{Path, PathBuf};

/// `names` under `root` that exist, then every `*.md` under `root/docs`, recursively, sorted.
#[allow(dead_code)] // not every including test reads the guide
pub fn markdown_files(root: &Path, names: &[&str]) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = names
        .iter()
        .map(|name| root.join(name))
        .filter(|path| path.is_file())
        .collect();
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Whether `text` is `pattern` where each `wildcard` stands for any text.
#[allow(dead_code)] // not every including test matches text
pub fn wildcard_matches(pattern: &str, wildcard: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split(wildcard).collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}
