//! `gpu-dra demo` and `gpu-dra packing-study` as a newcomer runs them.
use std::process::Command;

fn gpu_dra(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `gpu-dra run` on `extra` with its node folders under `dir`, a simulator state there and a
/// kubeconfig that does not exist: for start-up refusals. Returns success and stderr.
fn run_node(dir: &std::path::Path, extra: &[&str], env: Option<(&str, &str)>) -> (bool, String) {
    let at = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-dra"));
    command.arg("run").args(extra).args([
        "--node-name",
        "n1",
        "--sim-state",
        &at("hw.json"),
        "--registrar-dir",
        &at("registry"),
        "--plugin-dir",
        &at("plugin"),
        "--cdi-root",
        &at("cdi"),
        "--state-dir",
        &at("state"),
        "--kubeconfig",
        &at("no-kubeconfig"),
    ]);
    if let Some((name, value)) = env {
        command.env(name, value);
    }
    let out = command.output().expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn demo_allocates_prepares_and_leaves_nothing() {
    let (ok, out, err) = gpu_dra(&["demo"]);
    assert!(ok, "demo failed: {err}\n{out}");
    assert!(
        out.contains("big-gpu            → gpu-0"),
        "the 40Gi claim gets an H100, never the T4:\n{out}"
    );
    assert!(
        out.contains("mig-3g             → gpu-1-mig-3g40gb-9-4"),
        "{out}"
    );
    assert!(out.contains("PrepareCompleted"), "{out}");
    assert!(
        out.contains("/dev/nvidia-caps/nvidia-cap"),
        "the MIG spec has capability nodes:\n{out}"
    );
    assert!(
        out.contains(r#""containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05""#)
            && out.contains(r#""containerPath": "/usr/bin/nvidia-debugdump""#)
            && out.contains(r#""update-ldcache""#)
            && out.contains(r#""create-symlinks""#),
        "the spec mounts the driver's libraries and binaries and calls the toolkit's hook:\n{out}"
    );
    assert!(
        out.contains("CDI specs left: 0 · MIG instances left: 0 · claims in checkpoint: 0"),
        "{out}"
    );
}

#[test]
fn demo_keeps_its_files_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, _, err) = gpu_dra(&[
        "demo",
        "--gpus",
        "sim:1xA100-SXM4-40GB,1xH100-SXM5-80GB",
        "--work-dir",
        dir.path().to_str().expect("utf-8"),
    ]);
    assert!(ok, "{err}");
    assert!(dir.path().join("state/checkpoint.json").exists());
    assert!(dir.path().join("hardware.json").exists());
}

#[test]
fn packing_study_compares_both_orders() {
    let (ok, out, err) = gpu_dra(&["packing-study", "--events", "150", "--mean-lifetime", "30"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("name order (NVIDIA's):") && out.contains("best-fit order (ours):"),
        "{out}"
    );
    // The bound: failures no GPU had room for even with its instances placed anew, never more
    // than our failures.
    let number = |line_start: &str| -> usize {
        out.lines()
            .find(|l| l.trim_start().starts_with(line_start))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} line: {out}"))
    };
    assert!(
        number("capacity bound (ours)") <= number("best-fit order (ours)"),
        "{out}"
    );
    assert!(out.contains("were fragmentation"), "{out}");
    // Without fragmentation (instances re-placed freely) a replay of the same trace.
    assert!(number("no fragmentation") <= 150, "{out}");
    // Two GPUs: the exact best order on request (here a mix with few states, for a debug build).
    let (ok, out, err) = gpu_dra(&[
        "packing-study",
        "--gpus",
        "sim:2xH100-SXM5-80GB",
        "--best-order-pairs",
        "--events",
        "40",
        "--mix",
        "7g.80gb=1,4g.40gb=1,3g.40gb=1",
        "--mean-lifetime",
        "2",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("exact long-run rates (every state solved)"),
        "{out}"
    );
    // Several GPUs with few states each: the exact best order in continuous time, ours beside
    // it and (simulated) with real minors.
    // Three A30s with a small mix: every node state is solved in a moment.
    let a30_study = |flags: &[&str]| {
        let mut args = vec!["packing-study", "--gpus", "sim:3xA30-24GB"];
        args.extend_from_slice(flags);
        args.extend([
            "--events",
            "20",
            "--mix",
            "1g.6gb=5,2g.12gb=3,4g.24gb=2",
            "--mean-lifetime",
            "2",
        ]);
        gpu_dra(&args)
    };
    let (ok, out, err) = a30_study(&["--best-order-many"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("in continuous time, every node state solved"),
        "{out}"
    );
    assert!(
        out.contains("mean lifetime 2: 3276 states; name order"),
        "{out}"
    );
    let (ok, _, err) = gpu_dra(&[
        "packing-study",
        "--gpus",
        "sim:1xH100-SXM5-80GB,1xA30-24GB",
        "--best-order-many",
        "--events",
        "10",
    ]);
    assert!(!ok);
    assert!(err.contains("--best-order-many"), "{err}");
    // Any node of identical GPUs: the proven floor beside name order and ours, simulated.
    let (ok, out, err) = a30_study(&["--best-order-bound"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("mean lifetime 2: name order")
            && out.contains("no order fails fewer than")
            && out.contains("re-placing instances freely")
            && !out.contains("values that add up"),
        "{out}"
    );
    // The second floor only when asked for, and only with the first.
    let (ok, out, err) = a30_study(&["--best-order-bound", "--additive-bound"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("re-placing instances freely") && out.contains("values that add up over GPUs"),
        "{out}"
    );
    let (ok, _, err) = gpu_dra(&["packing-study", "--additive-bound", "--events", "10"]);
    assert!(!ok);
    assert!(
        err.contains("--additive-bound") && err.contains("--best-order-bound"),
        "{err}"
    );
    let (ok, _, err) = gpu_dra(&[
        "packing-study",
        "--gpus",
        "sim:1xH100-SXM5-80GB,1xA30-24GB",
        "--best-order-bound",
        "--events",
        "10",
    ]);
    assert!(!ok);
    assert!(err.contains("--best-order-bound"), "{err}");
    let (ok, _, err) = gpu_dra(&["packing-study", "--best-order-pairs", "--events", "10"]);
    assert!(!ok);
    assert!(err.contains("--best-order-pairs"), "{err}");
    let (ok, _, err) = gpu_dra(&["packing-study", "--events", "10", "--mix", "9g.99gb=1"]);
    assert!(!ok);
    assert!(err.contains("\"9g.99gb\" is not a MIG profile"), "{err}");
}

#[test]
fn packing_study_sweeps_lifetimes_seeds_and_mixes() {
    let (ok, out, err) = gpu_dra(&[
        "packing-study",
        "--gpus",
        "sim:1xH100-SXM5-80GB",
        "--events",
        "80",
        "--mean-lifetime",
        "2,4",
        "--seed",
        "1-2",
        "--mix",
        "all",
        "--checked",
        "5",
    ]);
    assert!(ok, "{err}");
    // One table per named mix, one row per lifetime, resolved to this GPU's profiles.
    for mix in [
        "mix default (1g.10gb=35,1g.20gb=10,2g.20gb=20,3g.40gb=20,4g.40gb=8,7g.80gb=7)",
        "mix inference (",
        "mix training (",
        "mix whole-gpus (",
    ] {
        assert!(out.contains(mix), "{mix}: {out}");
    }
    assert!(out.contains("gpu=15)"), "{out}");
    assert!(out.contains("over 2 seed(s)"), "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("  | 2 |") || l.starts_with("  | 4 |"))
        .collect();
    assert_eq!(rows.len(), 8, "{out}");
    // On one GPU the replay without fragmentation and the hindsight optimum are computed, and
    // the best order is solved exactly: the goal column measures ours against it.
    for row in &rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert!(
            cells[5].contains(" ± ") && cells[6].contains(" ± "),
            "{row}"
        );
        assert!(
            cells[9].contains("the best order")
                || cells[9].contains("fewer than name order")
                || cells[9].contains("no failures"),
            "{row}"
        );
    }
    let exact: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("exact long-run rates (every state solved)"))
        .collect();
    assert_eq!(exact.len(), 8, "{out}");
    assert!(exact.iter().all(|l| l.contains("the best order")), "{out}");

    // Named mixes resolve by shape on other models too.
    let (ok, out, err) = gpu_dra(&[
        "packing-study",
        "--gpus",
        "sim:1xA100-SXM4-40GB",
        "--events",
        "40",
        "--mix",
        "default",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("1g.5gb=35,1g.10gb=10,2g.10gb=20,3g.20gb=20,4g.20gb=8,7g.40gb=7"),
        "{out}"
    );

    // The trace for replays elsewhere: one line per arrival.
    let (ok, out, err) = gpu_dra(&[
        "packing-study",
        "--events",
        "5",
        "--mix",
        "gpu=1,1g.10gb=1",
        "--print-trace",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    for (i, line) in lines.iter().enumerate() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields[0], i.to_string(), "{out}");
        assert!(fields[1] == "gpu" || fields[1] == "1g.10gb", "{out}");
        assert!(fields[2].parse::<usize>().expect("departure") > i, "{out}");
    }

    // Bad sweeps are refused, naming the flag.
    for (args, want) in [
        (vec!["--seed", "5-1"], "--seed \"5-1\""),
        (vec!["--mean-lifetime", "10,x"], "--mean-lifetime \"10,x\""),
        (vec!["--mix", "busy"], "\"busy\" is neither a named mix"),
        (vec!["--mix", "1g.10gb=0"], "every weight is 0"),
        (
            vec!["--mean-lifetime", "5,6", "--print-trace"],
            "--print-trace: give one",
        ),
    ] {
        let mut all = vec!["packing-study", "--events", "10"];
        all.extend(args);
        let (ok, _, err) = gpu_dra(&all);
        assert!(!ok, "{all:?} accepted");
        assert!(err.contains(want), "{all:?}: {err}");
    }
}

#[test]
fn cdi_prints_what_a_claims_containers_get_and_names_an_empty_driver_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("driver-root");
    let state = dir.path().join("hw.json");
    let state = state.to_str().expect("utf-8");
    let root_arg = root.to_str().expect("utf-8");
    let sim = ["--gpus", "sim:1xH100-SXM5-80GB,1xT4", "--sim-state", state];

    // An empty driver root: refused, naming it.
    let mut args = vec!["cdi"];
    args.extend(sim);
    args.extend(["--nvidia-driver-root", root_arg]);
    let (ok, _, err) = gpu_dra(&args);
    assert!(
        !ok && err.contains(root_arg) && err.contains("no libraries of driver"),
        "{err}"
    );

    let (ok, _, err) = gpu_dra(&[
        "sim",
        "--gpus",
        "sim:1xH100-SXM5-80GB,1xT4",
        "--node-name",
        "node",
        "--sim-state",
        state,
        "driver-root",
        root_arg,
    ]);
    assert!(ok, "{err}");
    args.extend(["--device", "gpu-1"]);
    let (ok, out, err) = gpu_dra(&args);
    assert!(ok, "{err}");
    let spec: serde_json::Value = serde_json::from_str(&out).expect("JSON spec");
    assert_eq!(spec["devices"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/nvidia1"
    );
    let mounts: Vec<&str> = spec["containerEdits"]["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["containerPath"].as_str())
        .collect();
    assert!(
        mounts.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so.1")
            && mounts.contains(&"/usr/bin/nvidia-debugdump"),
        "{mounts:?}"
    );
    // A MIG placement that is not carved has no spec yet.
    let (ok, _, err) = gpu_dra(&[
        "cdi",
        "--gpus",
        "sim:1xH100-SXM5-80GB,1xT4",
        "--sim-state",
        state,
        "--nvidia-driver-root",
        root_arg,
        "--device",
        "gpu-0-mig-1g10gb-19-0",
    ]);
    assert!(
        !ok && err.contains("--device gpu-0-mig-1g10gb-19-0"),
        "{err}"
    );
}

#[test]
fn the_driver_does_not_start_on_a_driver_root_without_the_driver() {
    let dir = tempfile::tempdir().expect("tempdir");
    let at = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let root = at("empty-root");
    std::fs::create_dir_all(&root).expect("root");
    let (ok, err) = run_node(
        dir.path(),
        &["--gpus", "sim:1xT4", "--nvidia-driver-root", &root],
        None,
    );
    assert!(
        !ok && err.contains(&format!(
            "--nvidia-driver-root {root}: no libraries of driver"
        )),
        "{err}"
    );
    assert!(
        !dir.path().join("cdi").exists(),
        "nothing was written before refusing"
    );
}

#[test]
fn a_hook_path_without_driver_files_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, err) = run_node(
        dir.path(),
        &[
            "--gpus",
            "sim:1xT4",
            "--nvidia-cdi-hook-path",
            "/usr/bin/nvidia-cdi-hook",
        ],
        None,
    );
    assert!(!ok && err.contains("--nvidia-cdi-hook-path"), "{err}");
}

#[test]
fn the_clique_label_without_compute_domains_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gpus = ["--gpus", "sim:1xGB200-186GB"];
    // As a flag, and as NVIDIA's variable.
    let flag = run_node(
        dir.path(),
        &[&gpus[..], &["--gpu-clique-label"]].concat(),
        None,
    );
    let variable = run_node(
        dir.path(),
        &gpus,
        Some(("GPU_CLIQUE_LABEL_ENABLED", "true")),
    );
    for (ok, err) in [flag, variable] {
        assert!(
            !ok && err.contains("--gpu-clique-label") && err.contains("--compute-domains"),
            "{err}"
        );
    }
    assert!(
        !dir.path().join("state").exists() && !dir.path().join("cdi").exists(),
        "nothing was written before refusing"
    );
}

#[test]
fn sim_inject_raises_faults_and_refuses_unclear_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("hw.json");
    let state = state.to_str().expect("utf-8");
    let sim = |args: &[&str]| {
        let mut all = vec!["sim", "--gpus", "sim:2xH100-SXM5-80GB", "--node-name", "n1"];
        all.extend_from_slice(&["--sim-state", state, "inject"]);
        all.extend_from_slice(args);
        gpu_dra(&all)
    };
    let (ok, _, err) = sim(&["--gpu", "1", "--xid", "79"]);
    assert!(ok, "{err}");
    let shown: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state).expect("state")).expect("json");
    assert_eq!(shown["gpus"][1]["lost"], true, "XID 79: off the bus");
    assert_eq!(shown["events"][0]["event"]["kind"]["code"], 79);

    let (ok, _, err) = sim(&["--gpu", "0"]);
    assert!(
        !ok && err.contains("--xid N, --ecc-dbe, --lost, --reset"),
        "{err}"
    );
    let (ok, _, err) = sim(&["--gpu", "0", "--xid", "79", "--lost"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    let (ok, _, err) = sim(&["--gpu", "0", "--reset", "--gpu-instance", "3"]);
    assert!(
        !ok && err.contains("--gpu-instance goes with --xid or --ecc-dbe"),
        "{err}"
    );
    let (ok, _, err) = sim(&["--gpu", "7", "--lost"]);
    assert!(!ok && err.contains("no such GPU"), "{err}");
    let unchanged: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state).expect("state")).expect("json");
    assert_eq!(unchanged, shown, "refused input changes nothing");

    let (ok, _, err) = sim(&["--gpu", "1", "--reset"]);
    assert!(ok, "{err}");
    let reset: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state).expect("state")).expect("json");
    assert!(reset["gpus"][1].get("lost").is_none(), "{reset}");
}
