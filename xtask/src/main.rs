//! Weir's task runner: `cargo xtask <ci|tidy|test|bench|chaos>`.
//!
//! - `ci`: the single CI entry point: fmt check, tidy, the lean builds (the runtime without its
//!   CLI feature, the README's `word_count`), the test build with clippy as the workspace's
//!   compiler (every target, `-D warnings`), the tests, the doc tests.
//! - `tidy`: the workspace's dependency direction and the `//!` first line of every `.rs` file.
//! - `test [args]`: the tests only (nextest when installed, else `cargo test`), args passed on.
//!
//! `ci`, `test` and `chaos` first make sure the S3 server the storage tests use is installed
//! ([`s3::ensure_s3s_fs`]) and pass its path to the tests as `WEIR_S3FS_BIN`; `ci` and `test`
//! also make sure of iproute2, for the network partition test ([`apt::ensure_iproute2`]), and of
//! Chromium and its WebDriver, for the web UI test ([`apt::ensure_chromium`]), and of cmake and
//! the headers librdkafka's build needs, for the Kafka connectors ([`apt::ensure_kafka_build`]).
//! - `bench [name]`: release-build the examples and run a named benchmark (default `wordcount`).
//! - `chaos`: the heavy `#[ignore]`d scenarios, in release mode.
//! - `mutants`: the exactly-once and restore tests under each deliberate bug (`weir_mutant`),
//!   which must mostly fail.
//! - `chaos sim [args]`: the deterministic simulation (`weir-sim`): seeded schedules of whole
//!   jobs under faults, checked for exactly-once.
//! - `chaos fuzz [args]`: every decoder fuzzed (`weir-fuzz`, 10M mutated inputs by default) in
//!   the `fuzz` profile (release, with overflow checks); args go to `weir-fuzz`.
//!
//! Plain `std::process::Command` throughout; no shell scripts.

mod apt;
mod bench;
mod bench_disk;
mod bench_kafka;
mod bench_nexmark;
mod bench_wordcount;
mod benches;
mod compare;
mod lines;
mod mutants;
mod s3;
mod structure;
mod testcount;
mod tidy;

use anyhow::{Context, Result, bail};
use std::cell::Cell;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci            fmt check, tidy, lean builds, the test build linted by clippy, tests,
                doc tests (fails fast)
  tidy          dependency direction and `//!` first lines
  test [args]   the tests only (nextest if installed, else cargo test); args are passed on

ci, test and chaos install s3s-fs (the S3 server of the storage tests) once, into
$WEIR_TOOLS_DIR or ~/.cache/weir/tools, and pass it to the tests as WEIR_S3FS_BIN (set it to
use your own); ci and test install iproute2 with apt-get when it is missing and they run as root
(the network partition test's hosts are network namespaces), and chromium and chromium-driver
for the web UI test (WEIR_CHROMIUM_BIN and WEIR_CHROMEDRIVER_BIN name your own)
  bench [name]  release benchmarks; names: {benches}
  bench compare REV [ROUNDS]
                word_count built at git revision REV against the work tree's, interleaved
                rounds (default 5): throughput, checkpoint p99, recovery; medians and ratios
  chaos         cargo test --workspace --release -- --ignored
  mutants       the exactly-once and restore tests under each deliberate bug (a restore that
                loads nothing, a dropped state handle): fails unless most of them fail
  chaos sim [--seeds N] [--first-seed S] [--mutation NAME] [--trace] [--threads T]
                the deterministic simulation: seeds S..S+N (default 0..100), each a whole job on
                one thread under seeded faults and virtual time, checked for exactly-once; a
                failing seed prints its replay command and trace; --mutation acts out a
                deliberate protocol bug (debug build)
  chaos fuzz [args]
                every decoder fuzzed: 10M mutated inputs in release (profile `fuzz`, overflow
                checks on); args go to weir-fuzz: --inputs N, --seconds S, --seed S,
                --target NAME, --target NAME --replay SEED";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("ci") => ci(&root),
        Some("tidy") => tidy::run(&root),
        Some("test") => tests(&root, rest),
        Some("bench") if rest.first().is_some_and(|a| a == "compare") => {
            compare::run(&root, rest.get(1..).unwrap_or_default())
        }
        Some("bench") => benches::run(&root, rest),
        Some("mutants") => mutants::run(&root, &s3::ensure_s3s_fs()?),
        Some("chaos") => match rest.first().map(String::as_str) {
            None => chaos(&root),
            Some("fuzz") => fuzz(&root, rest.get(1..).unwrap_or_default()),
            Some("sim") => sim(&root, rest.get(1..).unwrap_or_default()),
            Some(other) => bail!("unknown chaos scenario `{other}`\n\n{}", usage()),
        },
        Some("-h" | "--help" | "help") => {
            println!("{}", usage());
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{}", usage()),
        None => bail!("no command given\n\n{}", usage()),
    }
}

fn usage() -> String {
    USAGE.replace("{benches}", &benches::names().join(", "))
}

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or(manifest_dir)
}

/// `cargo` as the one that started us (`$CARGO`), else from `PATH`. Under CI (`CI` set) without
/// an explicit `CARGO_INCREMENTAL`, incremental compilation is off: a fresh clone gains nothing
/// from it, and its files are half of the test build's target directory (a CI run once ran out
/// of disk).
fn cargo(root: &Path) -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(program);
    cmd.current_dir(root);
    if std::env::var_os("CI").is_some() && std::env::var_os("CARGO_INCREMENTAL").is_none() {
        cmd.env("CARGO_INCREMENTAL", "0");
    }
    cmd
}

/// Runs `cmd` with inherited stdio, printing it first; a non-zero exit is an error.
fn run_cmd(mut cmd: Command) -> Result<()> {
    let shown = show(&cmd);
    println!("$ {shown}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// A command as a person would type it (program name without its directory).
fn show(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(cmd.get_program());
    std::iter::once(program)
        .chain(cmd.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

fn has_nextest(root: &Path) -> bool {
    let mut cmd = cargo(root);
    cmd.args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.status().is_ok_and(|s| s.success())
}

/// The package selection in `args` (`-p X`, `-pX`, `--package X`, `--package=X`) before any
/// `--`, as given.
fn package_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            break;
        }
        if arg == "-p" || arg == "--package" {
            out.push(arg.clone());
            out.extend(it.next().cloned());
        } else if arg.starts_with("--package=") || (arg.starts_with("-p") && arg.len() > 2) {
            out.push(arg.clone());
        }
    }
    out
}

/// The test commands of CI step 4: nextest (or `cargo test`) with `extra` args, then doc tests,
/// over the workspace or, when `extra` names packages (`-p`), over those. Both get
/// `WEIR_S3FS_BIN=s3s_fs` and the browser's paths (`browser`).
fn test_commands(
    root: &Path,
    extra: &[String],
    s3s_fs: &Path,
    browser: &[(&'static str, PathBuf)],
) -> Vec<(&'static str, Command)> {
    let packages = package_args(extra);
    let scope = if packages.is_empty() {
        vec!["--workspace".to_string()]
    } else {
        Vec::new()
    };
    let mut main = cargo(root);
    if has_nextest(root) {
        main.args(["nextest", "run", "--no-fail-fast"]);
    } else {
        main.arg("test");
    }
    main.args(&scope).args(extra);
    let mut doc = cargo(root);
    doc.arg("test").args(&scope).args(&packages).arg("--doc");
    for cmd in [&mut main, &mut doc] {
        cmd.env(s3::BIN_VAR, s3s_fs);
        for (var, path) in browser {
            cmd.env(var, path);
        }
    }
    vec![("test", main), ("doctest", doc)]
}

fn tests(root: &Path, extra: &[String]) -> Result<()> {
    apt::ensure_kafka_build()?;
    let s3s_fs = s3::ensure_s3s_fs()?;
    apt::ensure_iproute2()?;
    let browser = apt::ensure_chromium()?;
    let mut counts = testcount::Counts::default();
    let result = test_commands(root, extra, &s3s_fs, &browser)
        .into_iter()
        .try_for_each(|(_, cmd)| testcount::run_counting(cmd, &mut counts));
    println!("{}", counts.line());
    result
}

fn chaos(root: &Path) -> Result<()> {
    // The cluster scenarios checkpoint to S3, like the ordinary tests.
    let s3s_fs = s3::ensure_s3s_fs()?;
    let mut cmd = cargo(root);
    cmd.args(["test", "--workspace", "--release", "--", "--ignored"])
        .env(s3::BIN_VAR, &s3s_fs);
    println!("chaos: running the #[ignore]d heavy scenarios in release mode");
    run_cmd(cmd)
}

/// `chaos fuzz`: the `weir-fuzz` runner in the `fuzz` profile, which prints per-target counts
/// (inputs, decoded, errors, failures, slowest input, peak allocation) and fails on a failure.
fn fuzz(root: &Path, extra: &[String]) -> Result<()> {
    let mut cmd = cargo(root);
    cmd.args([
        "run",
        "--profile",
        "fuzz",
        "--package",
        "weir-fuzz",
        "--bin",
        "weir-fuzz",
        "--",
    ])
    .args(extra);
    println!("chaos fuzz: every decoder, on mutated valid encodings (release, overflow checks on)");
    run_cmd(cmd)
}

/// `chaos sim`: seeds of the deterministic simulation (`weir-sim`), in release, or in debug when
/// a deliberate bug is selected (`--mutation`, which exists in debug builds only).
fn sim(root: &Path, extra: &[String]) -> Result<()> {
    let mut cmd = cargo(root);
    cmd.args(["run", "--package", "weir-sim", "--bin", "weir-sim"]);
    if !extra.iter().any(|a| a == "--mutation") {
        cmd.arg("--release");
    }
    cmd.arg("--").args(extra);
    println!("chaos sim: whole jobs on one thread under seeded faults and virtual time");
    run_cmd(cmd)
}

/// Clippy as the compiler of the workspace's own crates, set up the way `cargo clippy -- -D
/// warnings` sets it up (`RUSTC_WORKSPACE_WRAPPER=clippy-driver`, `CLIPPY_ARGS`), but in the test
/// build, which also generates code. `cargo clippy --workspace --all-targets` is a check build
/// of its own: every dependency checked and every crate type-checked, then all of it compiled
/// again for the tests. CI on a fresh clone (2 cores, 2026-12-04): clippy 218 s plus the test
/// build's 247 s became one step of 285 s, with the same lints on the same targets (a needless
/// `return` added to `weir-core` fails it, naming the lint).
struct ClippyCompiler {
    driver: PathBuf,
}

impl ClippyCompiler {
    /// `clippy-driver` of the toolchain that builds the workspace (`rustc --print sysroot`).
    fn find(root: &Path) -> Result<Self> {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let out = Command::new(&rustc)
            .current_dir(root)
            .args(["--print", "sysroot"])
            .output()
            .with_context(|| format!("could not run `{} --print sysroot`", rustc.display()))?;
        if !out.status.success() {
            bail!("`rustc --print sysroot` failed ({})", out.status);
        }
        let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let driver = Path::new(&sysroot)
            .join("bin")
            .join(format!("clippy-driver{}", std::env::consts::EXE_SUFFIX));
        if !driver.is_file() {
            bail!(
                "{} not found: CI lints with clippy (`rustup component add clippy`)",
                driver.display()
            );
        }
        Ok(Self { driver })
    }

    fn apply(&self, cmd: &mut Command) {
        cmd.env("RUSTC_WORKSPACE_WRAPPER", &self.driver).env(
            "CLIPPY_ARGS",
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
        );
    }
}

/// One CI step: a name and what it does.
type Step = (&'static str, Box<dyn FnOnce() -> Result<()>>);

fn ci(root: &Path) -> Result<()> {
    let mut steps: Vec<Step> = Vec::new();
    let mut fmt = cargo(root);
    fmt.args(["fmt", "--all", "--", "--check"]);
    steps.push(("fmt", Box::new(move || run_cmd(fmt))));
    let tidy_root = root.to_path_buf();
    steps.push(("tidy", Box::new(move || tidy::run(&tidy_root))));
    // The builds that leave features out: the runtime without its `weir checkpoints` tool (the
    // `cli` feature), and the README's `word_count` without cluster mode, S3 or zstd (the tests
    // build it with all three), linted so that code only a full build uses is seen.
    let mut lean = cargo(root);
    lean.args([
        "check",
        "-p",
        "weir-runtime",
        "--no-default-features",
        "--lib",
    ]);
    let mut lean_example = cargo(root);
    lean_example.args([
        "clippy",
        "-p",
        "weir-examples",
        "--bin",
        "word_count",
        "--",
        "-D",
        "warnings",
    ]);
    steps.push((
        "lean-builds",
        Box::new(move || run_cmd(lean).and_then(|()| run_cmd(lean_example))),
    ));
    // Before the steps, so that a missing tool fails CI at once, not after the builds.
    apt::ensure_kafka_build()?;
    let s3s_fs = s3::ensure_s3s_fs()?;
    apt::ensure_iproute2()?;
    let browser = apt::ensure_chromium()?;
    // Clippy lints every target while the tests are built, instead of in a check build of its
    // own that then had to be compiled again (see `ClippyCompiler`).
    let clippy = ClippyCompiler::find(root)?;
    let mut build = cargo(root);
    if has_nextest(root) {
        build.args(["nextest", "run"]);
    } else {
        build.arg("test");
    }
    build.args(["--workspace", "--all-targets", "--no-run"]);
    clippy.apply(&mut build);
    steps.push((
        "clippy+build",
        Box::new(move || {
            println!("(clippy-driver compiles the workspace's crates, with `-D warnings`)");
            run_cmd(build)
        }),
    ));
    let counts = Rc::new(Cell::new(testcount::Counts::default()));
    for (name, mut cmd) in test_commands(root, &[], &s3s_fs, &browser) {
        clippy.apply(&mut cmd);
        let counts = Rc::clone(&counts);
        steps.push((
            name,
            Box::new(move || {
                let mut c = counts.get();
                let result = testcount::run_counting(cmd, &mut c);
                counts.set(c);
                result
            }),
        ));
    }

    let total = Instant::now();
    let count = steps.len();
    let mut times = Vec::new();
    for (i, (name, step)) in steps.into_iter().enumerate() {
        println!("\n==> ci step {}/{count}: {name}", i + 1);
        let start = Instant::now();
        let result = step();
        let took = start.elapsed();
        if let Err(e) = result {
            println!("<== ci step `{name}` FAILED after {}", secs(took));
            if counts.get() != testcount::Counts::default() {
                println!("{}", counts.get().line());
            }
            return Err(e.context(format!("ci step `{name}` failed")));
        }
        println!("<== ci step `{name}` ok in {}", secs(took));
        times.push((name, took));
    }
    println!("\nci step times:");
    for (name, took) in &times {
        println!("  {name:<12} {:>9}", secs(*took));
    }
    println!(
        "xtask ci: all {count} steps ok in {}",
        secs(total.elapsed())
    );
    // Last, so the log closes on the total rather than on a doc-test binary that ran nothing.
    println!("{}", counts.get().line());
    Ok(())
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::package_args;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn package_selection_is_found_in_any_spelling() {
        let args = strings(&[
            "-p",
            "weir-checkpoint",
            "--test",
            "storage_s3",
            "-pweir-core",
            "--package=weir-state",
            "--package",
            "weir-runtime",
            "--",
            "--nocapture",
        ]);
        assert_eq!(
            package_args(&args),
            strings(&[
                "-p",
                "weir-checkpoint",
                "-pweir-core",
                "--package=weir-state",
                "--package",
                "weir-runtime"
            ])
        );
        assert!(package_args(&strings(&["--test", "x", "--profile", "ci"])).is_empty());
    }
}
