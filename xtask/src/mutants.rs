//! `cargo xtask mutants`: the exactly-once and restore tests, built with each deliberate bug of
//! `weir_mutant` (a restore that loads nothing; subtask 0's keyed state handles dropped from
//! every acknowledgement), must mostly fail: a suite that passes with a broken restore proves
//! nothing.

use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::Stdio;

/// The deliberate bugs (`--cfg weir_mutant="…"`, in `runtime/src/master/`) and what they break.
const MUTANTS: [(&str, &str); 2] = [
    ("restore_noop", "a restore that loads nothing"),
    (
        "drop_handle",
        "subtask 0's keyed state handles dropped from every acknowledgement",
    ),
];

/// The exactly-once and restore tests: integration tests (not units), by name.
const TESTS: &str = "(package(weir-runtime) | package(weir-examples)) & kind(test) & \
    test(/restor|resum|rescal|round_trip|sigkill|fall|failover|under_failures|claim|exactly|kill/)";

/// Most: more than this share of the selected tests must fail under each mutant.
const MOST: f64 = 0.5;

/// Runs the selected tests under each mutant, in a target directory of their own (the flags
/// rebuild everything), and fails unless most of them fail under each.
pub fn run(root: &Path, s3s_fs: &Path) -> Result<()> {
    let mut verdicts = Vec::new();
    for (cfg, what) in MUTANTS {
        println!("\n==> mutant {cfg}: {what}");
        let mut cmd = crate::cargo(root);
        cmd.args([
            "nextest",
            "run",
            "--no-fail-fast",
            "--workspace",
            "-E",
            TESTS,
        ])
        .env("RUSTFLAGS", format!("--cfg weir_mutant=\"{cfg}\""))
        .env("CARGO_TARGET_DIR", root.join("target").join("mutants"))
        .env(crate::s3::BIN_VAR, s3s_fs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let shown = crate::show(&cmd);
        println!("$ RUSTFLAGS='--cfg weir_mutant=\"{cfg}\"' {shown}");
        let out = cmd
            .output()
            .with_context(|| format!("could not start `{shown}`"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let (run, failed) = summary(&text)
            .with_context(|| format!("no nextest summary for mutant {cfg}:\n{text}"))?;
        for line in text.lines().filter(|l| l.trim_start().starts_with("PASS")) {
            println!("  survived: {}", line.trim());
        }
        println!("<== mutant {cfg}: {failed} of {run} tests failed");
        verdicts.push((cfg, run, failed));
    }
    println!("\nmutants:");
    let mut weak = Vec::new();
    for (cfg, run, failed) in &verdicts {
        let share = *failed as f64 / (*run).max(1) as f64;
        println!(
            "  {cfg:<14} {failed:>3} of {run:>3} failed ({:.0}%)",
            share * 100.0
        );
        if share <= MOST {
            weak.push(*cfg);
        }
    }
    if !weak.is_empty() {
        bail!("the tests did not mostly fail under: {}", weak.join(", "));
    }
    Ok(())
}

/// `(run, failed)` from nextest's closing `Summary [...] N tests run: P passed, F failed, ...`.
fn summary(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().rev().find(|l| l.contains("tests run:"))?;
    let rest = line.split("tests run:").nth(1)?;
    let run: u64 = line
        .split("tests run:")
        .next()?
        .split_whitespace()
        .last()?
        .parse()
        .ok()?;
    let failed = rest
        .split(',')
        .find_map(|part| part.trim().strip_suffix(" failed")?.trim().parse().ok())
        .unwrap_or(0);
    Some((run, failed))
}

#[cfg(test)]
mod tests {
    use super::summary;

    #[test]
    fn reads_nextests_summary() {
        let text =
            "  PASS x\n     Summary [  57.4s] 60 tests run: 12 passed, 48 failed, 3 skipped\n";
        assert_eq!(summary(text), Some((60, 48)));
        assert_eq!(
            summary("Summary [1s] 5 tests run: 5 passed, 0 skipped"),
            Some((5, 0))
        );
        assert_eq!(summary("nothing"), None);
    }
}
