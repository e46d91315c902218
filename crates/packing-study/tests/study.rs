//! `gpu-dra-packing-study` as a newcomer runs it: both orders on one trace, the limits beside
//! them, sweeps, the trace for replays elsewhere, refusals naming the flag, and runs on the
//! catalog's newer MIG models.
use std::process::{Command, Output};

fn study_output(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-dra-packing-study"))
        .args(args)
        .env_remove("GPU_DRA_GPUS")
        .output()
        .expect("runs")
}

fn study(args: &[&str]) -> (bool, String, String) {
    let out = study_output(args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn packing_study_compares_both_orders() {
    let (ok, out, err) = study(&["--events", "150", "--mean-lifetime", "30"]);
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
    let (ok, out, err) = study(&[
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
        let mut args = vec!["--gpus", "sim:3xA30-24GB"];
        args.extend_from_slice(flags);
        args.extend([
            "--events",
            "20",
            "--mix",
            "1g.6gb=5,2g.12gb=3,4g.24gb=2",
            "--mean-lifetime",
            "2",
        ]);
        study(&args)
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
    let (ok, _, err) = study(&[
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
    let (ok, _, err) = study(&["--additive-bound", "--events", "10"]);
    assert!(!ok);
    assert!(
        err.contains("--additive-bound") && err.contains("--best-order-bound"),
        "{err}"
    );
    let (ok, _, err) = study(&[
        "--gpus",
        "sim:1xH100-SXM5-80GB,1xA30-24GB",
        "--best-order-bound",
        "--events",
        "10",
    ]);
    assert!(!ok);
    assert!(err.contains("--best-order-bound"), "{err}");
    let (ok, _, err) = study(&["--best-order-pairs", "--events", "10"]);
    assert!(!ok);
    assert!(err.contains("--best-order-pairs"), "{err}");
    let (ok, _, err) = study(&["--events", "10", "--mix", "9g.99gb=1"]);
    assert!(!ok);
    assert!(err.contains("\"9g.99gb\" is not a MIG profile"), "{err}");
}

#[test]
fn packing_study_sweeps_lifetimes_seeds_and_mixes() {
    let (ok, out, err) = study(&[
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
    let (ok, out, err) = study(&[
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
    let (ok, out, err) = study(&["--events", "5", "--mix", "gpu=1,1g.10gb=1", "--print-trace"]);
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
        let mut all = vec!["--events", "10"];
        all.extend(args);
        let (ok, _, err) = study(&all);
        assert!(!ok, "{all:?} accepted");
        assert!(err.contains(want), "{all:?}: {err}");
    }
}

#[test]
fn packing_study_runs_on_the_new_models() {
    let runs = [
        (
            "sim:2xB200-SXM6-180GB",
            "1g.23gb=35,1g.45gb=10,2g.45gb=20,3g.90gb=20,4g.90gb=8,7g.180gb=7",
        ),
        (
            "sim:2xGB200-186GB",
            "1g.23gb=35,1g.47gb=10,2g.47gb=20,3g.93gb=20,4g.93gb=8,7g.186gb=7",
        ),
        (
            "sim:2xH20-96GB",
            "1g.12gb=35,1g.24gb=10,2g.24gb=20,3g.48gb=20,4g.48gb=8,7g.96gb=7",
        ),
        (
            "sim:2xGH200-96GB",
            "1g.12gb=35,1g.24gb=10,2g.24gb=20,3g.48gb=20,4g.48gb=8,7g.96gb=7",
        ),
        (
            "sim:2xRTX-PRO-6000-BSE-96GB",
            "1g.24gb=40,1g.24gb+gfx=10,2g.48gb=30,4g.96gb=10,1g.24gb-me=10",
        ),
    ];
    for (spec, mix) in runs {
        let out = study_output(&[
            "--gpus", spec, "--events", "60", "--seed", "1", "--mix", mix,
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{spec}: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("best-fit order"), "{spec}: {stdout}");
    }
}
