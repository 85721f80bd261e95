//! `cargo xtask bench compare REV [ROUNDS]`: the `word_count` of git revision REV against the
//! work tree's, in one run, interleaved: throughput at p=2 with 1 s checkpoints, checkpoint p99
//! at 100 ms checkpoints, and recovery time, as medians of ROUNDS rounds (default 5).
//!
//! REV is checked out into a git worktree under `<target>/bench-baseline/<commit>` and built
//! there (its own target directory, kept for the next comparison). Each round runs both binaries
//! on each measurement, the order alternating round by round, so that a shared machine's drift
//! lands on both alike.

use crate::bench::{Bench, Config, Summary, median};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Records per run, as the `wordcount` benchmark.
const RECORDS: u64 = 20_000_000;

/// The thresholds the comparison is judged by.
const MIN_THROUGHPUT_RATIO: f64 = 0.97;
/// "Not worse" for latencies: at most this ratio, or at most [`LATENCY_SLACK_MS`] more (a
/// recovery of about a millisecond is reported to 0.1 ms, and one step is already 7%).
const LATENCY_TOLERANCE: f64 = 1.10;
/// See [`LATENCY_TOLERANCE`].
const LATENCY_SLACK_MS: f64 = 0.5;

/// Runs the comparison; `args` are `REV [ROUNDS]`.
pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let Some(rev) = args.first() else {
        bail!("usage: cargo xtask bench compare REV [ROUNDS]");
    };
    let rounds: usize = match args.get(1) {
        Some(n) => n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .with_context(|| format!("ROUNDS must be a positive number, not {n:?}"))?,
        None => 5,
    };
    if args.len() > 2 {
        bail!("bench compare takes REV and at most ROUNDS");
    }
    let target = crate::tidy::target_dir(root)?;
    let baseline = build_baseline(root, &target, rev)?;
    let mut build = crate::cargo(root);
    build.args([
        "build",
        "--release",
        "-p",
        "weir-examples",
        "--bin",
        "word_count",
    ]);
    crate::run_cmd(build)?;
    let scratch = target.join("xtask-bench");
    let bench = |word_count: PathBuf| Bench {
        word_count,
        bare_loop: PathBuf::new(),
        nexmark: PathBuf::new(),
        kafka_word_count: PathBuf::new(),
        state_bench: PathBuf::new(),
        state_disk_bench: PathBuf::new(),
        scratch: scratch.clone(),
    };
    let sides = [
        ("before", bench(baseline)),
        ("after", bench(target.join("release").join("word_count"))),
    ];
    let measures = measures();
    // results[measure][side]: one value per round.
    let mut results = vec![[Vec::new(), Vec::new()]; measures.len()];
    for round in 0..rounds {
        eprintln!("round {}/{rounds}", round + 1);
        for (m, measure) in measures.iter().enumerate() {
            let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                let summary = sides[side].1.run(&measure.config)?;
                let value = (measure.value)(&summary).with_context(|| {
                    format!("{}: `{}` reported no value", sides[side].0, measure.name)
                })?;
                results[m][side].push(value);
            }
        }
    }
    println!(
        "\nbench compare: {rev} (before) against the work tree (after), {rounds} interleaved rounds, medians\n"
    );
    println!(
        "  {:<34} {:>12} {:>12} {:>8}  verdict",
        "measure", "before", "after", "ratio"
    );
    for (measure, [before, after]) in measures.iter().zip(&results) {
        let (b, a) = (
            median(before).context("no runs")?,
            median(after).context("no runs")?,
        );
        let ratio = a / b;
        let (ok, rule) = if measure.higher_is_better {
            (
                ratio >= MIN_THROUGHPUT_RATIO,
                format!(">= {MIN_THROUGHPUT_RATIO}"),
            )
        } else {
            (
                ratio <= LATENCY_TOLERANCE || a - b <= LATENCY_SLACK_MS,
                format!(
                    "<= {LATENCY_TOLERANCE} or <= +{LATENCY_SLACK_MS} ms (not worse, with noise)"
                ),
            )
        };
        println!(
            "  {:<34} {:>12.1} {:>12.1} {ratio:>8.3}  {} {rule}",
            measure.name,
            b,
            a,
            if ok { "PASS" } else { "FAIL" }
        );
        println!("    before: {}\n    after:  {}", join(before), join(after));
    }
    Ok(())
}

fn join(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One measurement: a run and the value read from its summary.
struct Measure {
    name: &'static str,
    config: Config,
    value: fn(&Summary) -> Option<f64>,
    higher_is_better: bool,
}

fn measures() -> Vec<Measure> {
    vec![
        Measure {
            name: "throughput p=2 ckpt=1s (k rec/s)",
            config: Config {
                records: RECORDS,
                parallelism: 2,
                checkpoint_interval: Some("1s"),
                ..Config::default()
            },
            value: |s| Some(s.records_per_s / 1e3),
            higher_is_better: true,
        },
        Measure {
            name: "checkpoint p99 p=2 ckpt=100ms (ms)",
            config: Config {
                records: RECORDS,
                parallelism: 2,
                checkpoint_interval: Some("100ms"),
                ..Config::default()
            },
            value: |s| s.checkpoint_p99_ms,
            higher_is_better: false,
        },
        Measure {
            name: "recovery p=2 fail-after=10M (ms)",
            config: Config {
                records: RECORDS,
                parallelism: 2,
                checkpoint_interval: Some("100ms"),
                fail_after: Some(RECORDS / 2),
                ..Config::default()
            },
            value: |s| s.recovery_ms,
            higher_is_better: false,
        },
    ]
}

/// Checks REV out into a worktree (once per commit) and builds its release `word_count`.
fn build_baseline(root: &Path, target: &Path, rev: &str) -> Result<PathBuf> {
    let commit = git(
        root,
        &["rev-parse", "--verify", &format!("{rev}^{{commit}}")],
    )
    .with_context(|| format!("{rev:?} is not a commit of this repository"))?;
    let base = target.join("bench-baseline");
    let tree = base.join(&commit);
    if !tree.join("Cargo.toml").is_file() {
        std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
        let _ = git(root, &["worktree", "prune"]);
        let path = tree.to_string_lossy().into_owned();
        git(root, &["worktree", "add", "--detach", &path, &commit])?;
    }
    let mut build = crate::cargo(&tree);
    build
        .args([
            "build",
            "--release",
            "-p",
            "weir-examples",
            "--bin",
            "word_count",
        ])
        .env("CARGO_TARGET_DIR", base.join("target"));
    crate::run_cmd(build)?;
    Ok(base.join("target").join("release").join("word_count"))
}

/// Runs `git args` in `root` and returns its trimmed output.
fn git(root: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .current_dir(root)
        .args(args)
        .output()
        .context("could not run git")?;
    if !out.status.success() {
        bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
