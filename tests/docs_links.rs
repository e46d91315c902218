//! Every relative link of the documentation leads somewhere: README.md, ARCHITECTURE.md (when
//! present), CHANGELOG.md and every `docs/**/*.md`. A link `[text](path)` or `[text](path#anchor)`
//! must name a file or folder that exists relative to the linking file; an anchor on a Markdown
//! target (or a bare `#anchor` in the same file) must be the slug of one of its headings, as GitHub
//! makes them. Links to the web (`http:`, `https:`, `mailto:`) are not followed.

#[path = "common/docs.rs"]
mod docs;

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documentation files: the top-level pages that exist, then `docs/` recursively.
fn doc_files() -> Vec<PathBuf> {
    docs::markdown_files(&root(), &["README.md", "ARCHITECTURE.md", "CHANGELOG.md"])
}

/// The lines outside fenced code blocks (``` or ~~~), numbered from 1, as they are.
fn unfenced_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let first = trimmed.chars().next();
        let marker: String = trimmed.chars().take_while(|&c| Some(c) == first).collect();
        if matches!(first, Some('`') | Some('~')) && marker.len() >= 3 {
            match &fence {
                None => {
                    fence = Some(marker);
                    continue;
                }
                Some(open) if marker.starts_with(open.as_str()) => {
                    fence = None;
                    continue;
                }
                Some(_) => {}
            }
        }
        if fence.is_none() {
            out.push((index + 1, line));
        }
    }
    out
}

/// The lines outside fenced code blocks, with inline code spans blanked out, so that neither
/// `[--flag]` in a command nor a link shown as code is read as a link.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    unfenced_lines(text)
        .into_iter()
        .map(|(number, line)| (number, strip_code_spans(line)))
        .collect()
}

/// Replaces each inline code span (a run of N backticks up to the next run of exactly N) by
/// spaces; an unmatched run is kept as it is.
fn strip_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let other = chars[j..].iter().take_while(|&&c| c == '`').count();
                if other == run {
                    close = Some(j);
                    break;
                }
                j += other;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                out.extend(std::iter::repeat_n(' ', end + run - i));
                i = end + run;
            }
            None => {
                out.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    out
}

/// The targets of inline links and images on one line: what stands between `](` and its `)`,
/// with nested parentheses balanced and an optional `"title"` dropped.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let bytes = line.as_bytes();
    let mut start = 0;
    while let Some(found) = line[start..].find("](") {
        let open = start + found + 2;
        let mut depth = 1;
        let mut end = open;
        while end < bytes.len() {
            match bytes[end] {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            end += 1;
        }
        if depth != 0 {
            break;
        }
        let mut target = line[open..end].trim();
        if let Some(stripped) = target.strip_prefix('<').and_then(|t| t.strip_suffix('>')) {
            target = stripped;
        }
        let target = target.split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        start = end + 1;
    }
    targets
}

/// GitHub's heading anchor: lower case; letters, digits, `-` and `_` kept, spaces turned into
/// `-`, everything else dropped. Markdown inside the heading counts by its text: a link by its
/// text, code by its content.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](url) -> text
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](") else {
            break;
        };
        let close = open + close;
        let Some(end) = rest[close..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[close + end + 1..];
    }
    text.push_str(rest);
    text.chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors a Markdown file's headings make, with GitHub's `-1`, `-2` suffixes on repeats.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in unfenced_lines(text) {
        let trimmed = line.trim_start();
        let level = trimmed.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&level) || !trimmed[level..].starts_with(' ') {
            continue;
        }
        let base = slug(trimmed[level..].trim().trim_end_matches('#').trim());
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

fn anchors_of(path: &Path) -> HashSet<String> {
    anchors(&fs::read_to_string(path).unwrap_or_default())
}

fn broken_links() -> Vec<String> {
    let root = root();
    let mut broken = Vec::new();
    for file in doc_files() {
        let text = fs::read_to_string(&file).unwrap();
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (number, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                let lower = target.to_ascii_lowercase();
                if target.is_empty()
                    || lower.starts_with("http://")
                    || lower.starts_with("https://")
                    || lower.starts_with("mailto:")
                {
                    continue;
                }
                let (path_part, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let resolved = if path_part.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap().join(path_part)
                };
                if !resolved.exists() {
                    broken.push(format!("{shown}:{number}: {target}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if resolved.extension().is_none_or(|ext| ext != "md") || resolved.is_dir() {
                    continue;
                }
                if !anchors_of(&resolved).contains(&anchor.to_lowercase()) {
                    broken.push(format!(
                        "{shown}:{number}: {target}: no heading makes #{anchor}"
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_leads_somewhere() {
    let files = doc_files();
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "no README.md found under {}",
        root().display()
    );
    let broken = broken_links();
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("ComputeDomains (multi-node NVLink, `compute-domain.nvidia.com`)"),
        "computedomains-multi-node-nvlink-compute-domainnvidiacom"
    );
    assert_eq!(
        slug("GPUs for virtual machines (`--passthrough`)"),
        "gpus-for-virtual-machines---passthrough"
    );
    assert_eq!(slug("Beside NVIDIA's driver"), "beside-nvidias-driver");
    assert_eq!(
        slug("MIG packing: how close to the limit"),
        "mig-packing-how-close-to-the-limit"
    );
    assert_eq!(slug("[Unreleased]"), "unreleased");
    assert_eq!(slug("snake_case and 8×H100"), "snake_case-and-8h100");
    let text = "# A\n## A\n```\n# not a heading\n```\n## B `c`\n";
    let found = anchors(text);
    for want in ["a", "a-1", "b-c"] {
        assert!(found.contains(want), "{want} missing from {found:?}");
    }
    assert!(!found.contains("not-a-heading"));
}

#[test]
fn links_are_found_outside_code_only() {
    let lines =
        prose_lines("see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](d.md#x \"t\")");
    let targets: Vec<String> = lines.iter().flat_map(|(_, l)| link_targets(l)).collect();
    assert_eq!(targets, ["a.md", "d.md#x"]);
}
