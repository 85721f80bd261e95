//! Weir's task runner: `cargo xtask <ci|tidy|test|bench|chaos>`.
//!
//! - `ci`: the single CI entry point: fmt check, tidy, clippy, the tests, the doc tests.
//! - `tidy`: the workspace's dependency direction and the `//!` first line of every `.rs` file.
//! - `test [args]`: the tests only (nextest when installed, else `cargo test`), args passed on.
//! - `bench [name]`: release-build the examples and run a named benchmark (default `wordcount`).
//! - `chaos`: the heavy `#[ignore]`d scenarios, in release mode.
//!
//! Plain `std::process::Command` throughout; no shell scripts.

mod bench;
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
  ci            fmt check, tidy, clippy, tests, doc tests (fails fast)
  tidy          dependency direction and `//!` first lines
  test [args]   the tests only (nextest if installed, else cargo test); args are passed on
  bench [name]  release benchmarks; names: {benches}
  chaos         cargo test --workspace --release -- --ignored";

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
        Some("bench") => bench::run(&root, rest),
        Some("chaos") => chaos(&root),
        Some("-h" | "--help" | "help") => {
            println!("{}", usage());
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{}", usage()),
        None => bail!("no command given\n\n{}", usage()),
    }
}

fn usage() -> String {
    USAGE.replace("{benches}", &bench::names().join(", "))
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

/// `cargo` as the one that started us (`$CARGO`), else from `PATH`.
fn cargo(root: &Path) -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(program);
    cmd.current_dir(root);
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

/// The test commands of CI step 4: nextest (or `cargo test`) with `extra` args, then doc tests.
fn test_commands(root: &Path, extra: &[String]) -> Vec<(&'static str, Command)> {
    let mut main = cargo(root);
    if has_nextest(root) {
        main.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        main.args(["test", "--workspace"]);
    }
    main.args(extra);
    let mut doc = cargo(root);
    doc.args(["test", "--workspace", "--doc"]);
    vec![("test", main), ("doctest", doc)]
}

fn tests(root: &Path, extra: &[String]) -> Result<()> {
    let mut counts = testcount::Counts::default();
    let result = test_commands(root, extra)
        .into_iter()
        .try_for_each(|(_, cmd)| testcount::run_counting(cmd, &mut counts));
    println!("{}", counts.line());
    result
}

fn chaos(root: &Path) -> Result<()> {
    let mut cmd = cargo(root);
    cmd.args(["test", "--workspace", "--release", "--", "--ignored"]);
    println!("chaos: running the #[ignore]d heavy scenarios in release mode");
    run_cmd(cmd)
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
    let mut clippy = cargo(root);
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    steps.push(("clippy", Box::new(move || run_cmd(clippy))));
    let counts = Rc::new(Cell::new(testcount::Counts::default()));
    for (name, cmd) in test_commands(root, &[]) {
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
        println!("  {name:<10} {:>9}", secs(*took));
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
