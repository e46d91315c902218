//! Module layering: which parts of the library may name which. Data flows one way (NVML → device
//! model → slices), and the prepare effects are leaves the orchestrator applies, so none of them
//! may reach back into what uses it. An import circle compiles fine in Rust, so only a scan of the
//! sources keeps these lines from eroding.
//!
//! Comment lines are skipped: a doc link to the layer above says who calls the code, it is not a
//! dependency.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively, sorted so failures list in a stable order; `dir`
/// itself when it is a file (a rule for one module).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    if dir.is_file() {
        return vec![dir.to_path_buf()];
    }
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()))
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `file:line: text` for each non-comment line under `dir` (relative to the package root; a
/// folder or one file) that contains one of `forbidden`.
fn violations(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = rust_files(&root.join(dir));
    assert!(!files.is_empty(), "no Rust files at {dir}: was it moved?");
    let mut found = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", file.display()));
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            // One report per line: `super::super::state` also contains `super::state`.
            if let Some(pattern) = forbidden.iter().find(|pattern| line.contains(*pattern)) {
                found.push(format!(
                    "{shown}:{}: names `{pattern}`: {}",
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

fn assert_none(rule: &str, found: Vec<String>) {
    assert!(found.is_empty(), "{rule}:\n{}", found.join("\n"));
}

#[test]
fn prepare_effects_do_not_import_the_orchestrator() {
    assert_none(
        "src/prepare/effects/ must not import the orchestrator (prepare::state), the planner \
         (prepare::plan) or the driver (prepare::driver); shared types belong in \
         prepare::error, prepare::config or another leaf module",
        violations(
            "src/prepare/effects",
            &[
                "prepare::state",
                "prepare::plan",
                "prepare::driver",
                // Longest first: the report names the pattern that matched.
                "super::super::state",
                "super::super::plan",
                "super::super::driver",
                "super::state",
                "super::plan",
                "super::driver",
            ],
        ),
    );
}

#[test]
fn device_model_does_not_import_prepare() {
    assert_none(
        "src/gpu/ must not import crate::prepare (data flows NVML → device model → slices)",
        violations("src/gpu", &["crate::prepare"]),
    );
}

#[test]
fn slices_do_not_import_prepare() {
    assert_none(
        "src/slices/ must not import crate::prepare (data flows NVML → device model → slices)",
        violations("src/slices", &["crate::prepare"]),
    );
}

#[test]
fn device_model_does_not_import_slices() {
    assert_none(
        "src/gpu/ must not import crate::slices (data flows NVML → device model → slices)",
        violations("src/gpu", &["crate::slices"]),
    );
}

// Import circles inside src/prepare/ that were taken apart (issue 56): each pair named one
// another. What both sides need lives in a leaf of its own now; these keep it there.

#[test]
fn the_planner_does_not_import_the_orchestrator() {
    assert_none(
        "src/prepare/plan.rs must not import prepare::state (which imports the planner); \
         DriverConfig is in prepare::config",
        violations("src/prepare/plan.rs", &["prepare::state", "super::state"]),
    );
    assert_none(
        "src/prepare/config.rs is a leaf: it must not import the orchestrator or the planner",
        violations(
            "src/prepare/config.rs",
            &[
                "prepare::state",
                "prepare::plan",
                "super::state",
                "super::plan",
            ],
        ),
    );
}

#[test]
fn in_flight_does_not_import_the_driver() {
    assert_none(
        "src/prepare/in_flight.rs must not import prepare::driver (which imports it); \
         Operation is in prepare (mod.rs)",
        violations(
            "src/prepare/in_flight.rs",
            &["prepare::driver", "super::driver"],
        ),
    );
}

#[test]
fn cgroups_do_not_import_mps() {
    assert_none(
        "src/prepare/cgroup.rs must not import prepare::mps (which imports it); mountinfo \
         parsing is in cgroup.rs",
        violations("src/prepare/cgroup.rs", &["prepare::mps", "super::mps"]),
    );
}

#[test]
fn the_checkpoint_does_not_import_the_takeover() {
    assert_none(
        "src/prepare/checkpoint.rs must not import prepare::takeover (which imports it); \
         NVIDIA's format is read in prepare::nvidia_checkpoint, TakenOver is in checkpoint.rs",
        violations(
            "src/prepare/checkpoint.rs",
            &["prepare::takeover", "super::takeover"],
        ),
    );
    assert_none(
        "src/prepare/nvidia_checkpoint.rs is a leaf: it must not import our checkpoint or the \
         takeover",
        violations(
            "src/prepare/nvidia_checkpoint.rs",
            &[
                "prepare::takeover",
                "prepare::checkpoint",
                "super::takeover",
                "super::checkpoint",
            ],
        ),
    );
}

#[test]
fn the_device_model_does_not_import_its_simulator() {
    // The simulator builds its PCI view and MIG profiles with these modules; their tests that
    // need it are in src/gpu/sim_tests.rs.
    for file in ["src/gpu/pci.rs", "src/gpu/mig.rs"] {
        assert_none(
            &format!("{file} must not import gpu::sim (which imports it)"),
            violations(file, &["gpu::sim::", "super::sim::"]),
        );
    }
}

// The top-level modules (the folders and files directly under src/) form no circle (issue 56):
// the node runtime depends on compute_domain, prepare on kubeapi, and never the other way back.
// A new circle among them fails the test below with every reference that closes it.

/// The top-level modules of the library: the folders and `.rs` files directly under `src/` (a
/// module may be both, as `kubeapi.rs` with `kubeapi/`); the crate roots are none of them.
fn top_level_modules(src: &Path) -> std::collections::BTreeSet<String> {
    let entries =
        fs::read_dir(src).unwrap_or_else(|error| panic!("cannot read {}: {error}", src.display()));
    let mut modules = std::collections::BTreeSet::new();
    for entry in entries {
        let path = entry
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", src.display()))
            .path();
        let name = if path.is_dir() {
            path.file_name()
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            path.file_stem()
        } else {
            None
        };
        if let Some(name) = name.and_then(|name| name.to_str())
            && name != "lib"
            && name != "main"
        {
            modules.insert(name.to_string());
        }
    }
    modules
}

/// How many modules deep `file` (relative to `src/`) is: `kubeapi.rs` and `node/mod.rs` are one
/// (a `super::` in them names the crate root), `node/options.rs` two.
fn module_depth(file: &Path) -> usize {
    let components = file.components().count();
    if file.file_stem().is_some_and(|stem| stem == "mod") {
        components - 1
    } else {
        components
    }
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The names a path at the crate root reaches from `text` (one identifier, or each item of a
/// `{…}` group, which may span lines): `(name, 1-based line)`.
fn root_names(text: &[char], start: usize, line: usize) -> Vec<(String, usize)> {
    let ident = |from: usize| -> String {
        text[from..]
            .iter()
            .take_while(|c| is_ident_char(**c))
            .collect()
    };
    if text.get(start) != Some(&'{') {
        return vec![(ident(start), line)];
    }
    let mut names = Vec::new();
    let (mut depth, mut line, mut expect_item) = (0usize, line, true);
    for (offset, c) in text[start..].iter().enumerate() {
        match c {
            '{' => {
                depth += 1;
                expect_item = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect_item = true,
            '\n' => line += 1,
            c if expect_item && is_ident_char(*c) => {
                names.push((ident(start + offset), line));
                expect_item = false;
            }
            _ => {}
        }
    }
    names
}

/// Each top-level module named in `source` (a file `depth` modules deep), with its 1-based
/// line: `crate::X` and `$crate::X` in `use` and in paths, `crate::{X, …}`, and `super::X` where
/// the `super`s reach the crate root. Comment lines are skipped. An inline module (`mod tests
/// { … }`) counts as its file, so a `super` in it may seem to reach higher than it does: that
/// can only add a reference, never hide one.
fn root_references(source: &str, depth: usize) -> Vec<(String, usize)> {
    // Comment lines are blanked, not removed, so line numbers stay.
    let text: Vec<char> = source
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("//") {
                ""
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .collect();
    let starts_with = |at: usize, word: &str| {
        word.chars()
            .enumerate()
            .all(|(i, c)| text.get(at + i) == Some(&c))
    };
    let mut found = Vec::new();
    let mut line = 1;
    let mut at = 0;
    while at < text.len() {
        if text[at] == '\n' {
            line += 1;
        }
        let boundary = at == 0 || !is_ident_char(text[at - 1]);
        if boundary && starts_with(at, "crate::") {
            found.extend(root_names(&text, at + "crate::".len(), line));
            at += "crate::".len();
            continue;
        }
        if boundary && starts_with(at, "super::") {
            let mut ups = 0;
            while starts_with(at, "super::") {
                ups += 1;
                at += "super::".len();
            }
            if ups >= depth {
                found.extend(root_names(&text, at, line));
            }
            continue;
        }
        at += 1;
    }
    found
}

/// Which top-level module names which: `(from, to)` → `file:line` of each reference.
type ModuleGraph = std::collections::BTreeMap<(String, String), Vec<String>>;

fn module_graph() -> ModuleGraph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let modules = top_level_modules(&src);
    assert!(
        modules.contains("node") && modules.contains("prepare"),
        "no modules found under {}: was it moved?",
        src.display()
    );
    let mut graph = ModuleGraph::new();
    for module in &modules {
        let mut files = Vec::new();
        for path in [src.join(format!("{module}.rs")), src.join(module)] {
            if path.exists() {
                files.extend(rust_files(&path));
            }
        }
        for file in files {
            let text = fs::read_to_string(&file)
                .unwrap_or_else(|error| panic!("cannot read {}: {error}", file.display()));
            let relative = file.strip_prefix(&src).unwrap_or(&file);
            let shown = file.strip_prefix(root).unwrap_or(&file).display();
            for (name, line) in root_references(&text, module_depth(relative)) {
                if &name != module && modules.contains(&name) {
                    graph
                        .entry((module.clone(), name))
                        .or_default()
                        .push(format!("{shown}:{line}"));
                }
            }
        }
    }
    graph
}

/// Every elementary circle of `graph`, each once, starting at its least module.
fn circles(graph: &ModuleGraph) -> Vec<Vec<String>> {
    fn walk(
        graph: &ModuleGraph,
        start: &str,
        path: &mut Vec<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        let Some(last) = path.last().cloned() else {
            return;
        };
        for (from, to) in graph.keys() {
            if *from != last {
                continue;
            }
            if to == start {
                found.push(path.clone());
            } else if to.as_str() > start && !path.contains(to) {
                path.push(to.clone());
                walk(graph, start, path, found);
                path.pop();
            }
        }
    }
    let modules: std::collections::BTreeSet<&String> = graph.keys().map(|(from, _)| from).collect();
    let mut found = Vec::new();
    for start in modules {
        walk(graph, start, &mut vec![start.clone()], &mut found);
    }
    found
}

/// `a -> b -> a` and, for each step, where `a` names `b` (`file:line`).
fn describe(graph: &ModuleGraph, circle: &[String]) -> String {
    let mut closed = circle.to_vec();
    closed.push(circle[0].clone());
    let mut text = closed.join(" -> ");
    for step in closed.windows(2) {
        let places = &graph[&(step[0].clone(), step[1].clone())];
        // The first few say where; a long list would bury the other steps.
        const SHOWN: usize = 8;
        let mut shown = places[..places.len().min(SHOWN)].join(", ");
        if places.len() > SHOWN {
            shown.push_str(&format!(" and {} more", places.len() - SHOWN));
        }
        text.push_str(&format!("\n    {} -> {}: {shown}", step[0], step[1]));
    }
    text
}

#[test]
fn top_level_modules_form_no_circle() {
    let graph = module_graph();
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles among src/'s top-level modules (a module names one that names it \
         back; move what both need into the lower one, or hand it over as parameters):\n  {}",
        found
            .iter()
            .map(|circle| describe(&graph, circle))
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

#[test]
fn references_to_top_level_modules_are_found_in_every_form() {
    let source = "use crate::gpu::Device;\n\
                  // crate::commented names nothing\n\
                  use crate::{\n    slices::{self, Pool},\n    kubeapi,\n};\n\
                  let x = crate::prepare::claims::KubeClaims::new();\n\
                  $crate::metrics::observe!();\n\
                  use super::super::health;\n\
                  mycrate::not_a_module();";
    let names = |depth| {
        root_references(source, depth)
            .into_iter()
            .map(|(name, line)| format!("{name}:{line}"))
            .collect::<Vec<_>>()
    };
    let crate_paths = ["gpu:1", "slices:4", "kubeapi:5", "prepare:7", "metrics:8"];
    let mut at_root = crate_paths.to_vec();
    at_root.push("health:9");
    assert_eq!(names(1), at_root, "a file directly in src/");
    assert_eq!(names(2), at_root, "two deep: super::super is the root");
    assert_eq!(
        names(3),
        crate_paths,
        "three deep: super::super is a module"
    );
}
