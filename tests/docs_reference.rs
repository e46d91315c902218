//! The reference pages cannot drift from the code they describe:
//!
//! - `docs/reference/commands.md`'s table of `gpu-dra run` flags has one row per flag of
//!   `gpu-dra run --help`, no row for a flag that is gone, and each row's environment variable and
//!   default as the binary prints them;
//! - every long flag of every command is named in the guide (the reference page, or the task
//!   pages for `match`, `explain`, `capacity` and `sim`);
//! - every metric the driver registers (`Metrics::encode`, each `# HELP` line) is named in
//!   `docs/reference/metrics.md` or `docs/concepts/health.md`, and every `gpu_dra_*` series those
//!   pages name exists.
//!
//! The chart values page is generated from `values.schema.json` and checked by `e2e/helm.sh`.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// A flag as `--help` or the table gives it: environment variable and default (empty when none).
#[derive(Debug, PartialEq, Eq)]
struct Flag {
    env: String,
    default: String,
}

/// `gpu-dra run --help`'s long flags, with their `[env: X=]` and `[default: Y]`.
fn help_flags() -> BTreeMap<String, Flag> {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["run", "--help"])
        .output()
        .expect("gpu-dra run --help runs");
    assert!(out.status.success(), "gpu-dra run --help failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    // From `Options:` to the first unindented line after it (the examples).
    let options = text
        .lines()
        .skip_while(|l| *l != "Options:")
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '));
    for line in options {
        let trimmed = line.trim_start();
        // A flag's first line: `--name <VALUE>` or `-v, --v <LEVEL>`, indented by 2 to 6.
        let indent = line.len() - trimmed.len();
        if (2..=6).contains(&indent) && (trimmed.starts_with("--") || trimmed.starts_with('-')) {
            let long = trimmed
                .split([' ', ','])
                .find(|word| word.starts_with("--"))
                .map(str::to_string);
            if let Some(long) = &long
                && long != "--help"
            {
                flags.insert(
                    long.clone(),
                    Flag {
                        env: String::new(),
                        default: String::new(),
                    },
                );
            }
            current = long.filter(|l| l != "--help");
            continue;
        }
        let Some(name) = &current else { continue };
        let Some(flag) = flags.get_mut(name) else {
            continue;
        };
        if let Some(env) = trimmed
            .strip_prefix("[env: ")
            .and_then(|s| s.split('=').next())
        {
            flag.env = env.to_string();
        } else if let Some(default) = trimmed
            .strip_prefix("[default: ")
            .and_then(|s| s.strip_suffix(']'))
        {
            flag.default = if default == "\"\"" {
                String::new()
            } else {
                default.to_string()
            };
        }
    }
    flags
}

/// The rows of the `gpu-dra run` flag table: `| `--flag <V>` | `ENV` | `default` | what |`.
fn documented_flags() -> BTreeMap<String, Flag> {
    let page = read("docs/reference/commands.md");
    let section = page
        .split("## `gpu-dra run`")
        .nth(1)
        .expect("commands.md has a `gpu-dra run` section");
    let unquote = |cell: &str| cell.trim().trim_matches('`').replace("\\|", "|");
    let mut flags = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `-")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        assert!(cells.len() >= 4, "a flag row of 4 cells: {line}");
        let long = cells[0]
            .trim_start_matches("| ")
            .trim_matches('`')
            .split([' ', ','])
            .find(|word| word.starts_with("--"))
            .unwrap_or_else(|| panic!("no long flag in {line}"))
            .to_string();
        let mut default = unquote(cells[2]);
        if default == "\"\"" {
            default = String::new();
        }
        flags.insert(
            long,
            Flag {
                env: unquote(cells[1]),
                default,
            },
        );
    }
    flags
}

#[test]
fn the_run_flag_table_is_the_binarys() {
    let help = help_flags();
    let documented = documented_flags();
    assert!(help.len() >= 40, "read {} flags from --help", help.len());
    let missing: Vec<_> = help
        .keys()
        .filter(|f| !documented.contains_key(*f))
        .collect();
    let stale: Vec<_> = documented
        .keys()
        .filter(|f| !help.contains_key(*f))
        .collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/reference/commands.md's `gpu-dra run` table: missing {missing:?}, no longer flags {stale:?}"
    );
    let differing: Vec<String> = help
        .iter()
        .filter(|(name, flag)| documented.get(*name) != Some(flag))
        .map(|(name, flag)| format!("{name}: --help {flag:?}, table {:?}", documented[name]))
        .collect();
    assert!(
        differing.is_empty(),
        "environment or default differs from --help:\n{}",
        differing.join("\n")
    );
}

/// Every long flag of every `gpu-dra` command (`--help` of each), except `--help` itself.
fn every_commands_flags() -> Vec<(String, String)> {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
            .args(args)
            .arg("--help")
            .output()
            .expect("gpu-dra --help runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&[]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(commands.len() >= 10, "commands: {commands:?}");
    let mut flags = Vec::new();
    for command in commands {
        let text = help(&[&command]);
        for line in text
            .lines()
            .skip_while(|l| *l != "Options:")
            .skip(1)
            .take_while(|l| l.is_empty() || l.starts_with(' '))
        {
            let trimmed = line.trim_start();
            let indent = line.len() - trimmed.len();
            if !(2..=6).contains(&indent) || !trimmed.starts_with('-') {
                continue;
            }
            if let Some(long) = trimmed
                .split([' ', ','])
                .find(|w| w.starts_with("--") && *w != "--help")
            {
                flags.push((command.clone(), long.to_string()));
            }
        }
    }
    flags
}

#[test]
fn every_flag_of_every_command_is_in_the_guide() {
    let mut guide = read("docs/reference/commands.md");
    for page in [
        "docs/tasks/capacity.md",
        "docs/tasks/explain.md",
        "docs/reference/simulated-gpus.md",
    ] {
        guide.push_str(&read(page));
    }
    let flags = every_commands_flags();
    let missing: Vec<String> = flags
        .iter()
        .filter(|(_, flag)| {
            !guide.match_indices(flag.as_str()).any(|(at, _)| {
                !guide[at + flag.len()..]
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
            })
        })
        .map(|(command, flag)| format!("gpu-dra {command} {flag}"))
        .collect();
    assert!(
        missing.is_empty(),
        "flags the guide never names (docs/reference/commands.md): {missing:?}"
    );
}

/// A series' base name: counters and histograms are named without their sample suffixes.
fn base(name: &str) -> &str {
    ["_total", "_bucket", "_sum", "_count", "_created"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

#[test]
fn every_metric_is_documented_and_every_documented_metric_exists() {
    let text = gpu_dra::metrics::Metrics::new()
        .encode()
        .expect("the registry encodes");
    let registered: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .filter_map(|l| l.split(' ').next())
        .filter(|name| name.starts_with("gpu_dra_"))
        .map(|name| base(name).to_string())
        .collect();
    assert!(
        registered.len() >= 10,
        "{} gpu_dra_ metrics",
        registered.len()
    );
    let pages = read("docs/reference/metrics.md") + &read("docs/concepts/health.md");
    // The metrics page names series without their common prefix, in backticks.
    let named: BTreeSet<String> = pages
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|code| code.split([',', ' ']))
        .map(|word| word.split('{').next().unwrap_or(word).trim())
        .filter(|word| !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(|word| {
            let full = if word.starts_with("gpu_dra_") {
                word.to_string()
            } else {
                format!("gpu_dra_{word}")
            };
            base(&full).to_string()
        })
        .collect();
    let undocumented: Vec<_> = registered.difference(&named).collect();
    assert!(
        undocumented.is_empty(),
        "metrics missing from docs/reference/metrics.md (or docs/concepts/health.md): {undocumented:?}"
    );
    // Names the pages give with the full prefix must exist (bare words may be label values). A
    // labelled family is encoded only once it has a series: those are found by their
    // registration in the source instead.
    let source = read("src/metrics/mod.rs");
    let stale: Vec<_> = pages
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|code| code.split([',', ' ', '{', '(', ')']))
        .filter(|word| word.starts_with("gpu_dra_"))
        .map(|word| base(word.trim_end_matches(['.', ':'])).to_string())
        .filter(|name| name != "gpu_dra_" && !registered.contains(name))
        .filter(|name| {
            let bare = name.trim_start_matches("gpu_dra_");
            !source.contains(&format!("\"{bare}\""))
        })
        .collect();
    assert!(
        stale.is_empty(),
        "series the docs name that the driver does not register: {stale:?}"
    );
}
