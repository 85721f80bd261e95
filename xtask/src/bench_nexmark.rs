//! `cargo xtask bench nexmark`: each Nexmark query at p=1 and p=2 over 10M events with 1 s
//! checkpoints, throughput per core against nexmark-flink's published Flink 1.13 figures.

use crate::bench::{Bench, median, parse_fields};
use crate::lines::{last_line, run_logged};
use anyhow::{Context, Result, bail};
use std::process::Command;

const EVENTS: u64 = 10_000_000;
/// Rounds, interleaved (every query and parallelism once per round).
const REPS: usize = 3;
/// Weir's per-core throughput must be at least this many times nexmark-flink's.
const TARGET_FACTOR: f64 = 5.0;

/// nexmark-flink's published throughput per core for Flink 1.13 (SQL on RocksDB), events/s.
const FLINK_PER_CORE: &[(&str, f64)] = &[
    ("q0", 155_000.0),
    ("q1", 158_000.0),
    ("q2", 175_000.0),
    ("q3", 152_000.0),
    ("q4", 34_300.0),
    ("q5", 22_100.0),
    ("q7", 12_300.0),
    ("q8", 146_000.0),
    ("q11", 39_700.0),
];

/// One run's figures.
struct Run {
    events_per_s: f64,
    events_per_core_s: f64,
}

fn run_once(b: &Bench, query: &str, parallelism: u32) -> Result<Run> {
    let dir = b.scratch.join(format!("nexmark-{query}-p{parallelism}"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = Command::new(&b.nexmark);
    cmd.args(["--query", query, "--events", &EVENTS.to_string()])
        .args(["--parallelism", &parallelism.to_string()])
        .args(["--checkpoint-interval", "1s", "--checkpoint-dir"])
        .arg(dir.join("checkpoints"))
        .arg("--savepoint-dir")
        .arg(dir.join("savepoints"));
    let (shown, out) = run_logged(&mut cmd)?;
    let _ = std::fs::remove_dir_all(&dir);
    let line = last_line(&out).with_context(|| format!("`{shown}` printed nothing"))?;
    println!("  {line}");
    let fields = parse_fields(line)?;
    let number = |key: &str| -> Result<f64> {
        fields
            .get(key)
            .with_context(|| format!("no {key} in {line:?}"))?
            .parse()
            .with_context(|| format!("{key} in {line:?}"))
    };
    if number("events")? as u64 != EVENTS {
        bail!("`{shown}` read {} events, not {EVENTS}", number("events")?);
    }
    Ok(Run {
        events_per_s: number("events_per_s")?,
        events_per_core_s: number("events_per_core_s")?,
    })
}

pub fn nexmark(b: &Bench) -> Result<()> {
    let configs: Vec<(&str, u32)> = FLINK_PER_CORE
        .iter()
        .flat_map(|(q, _)| [(*q, 1u32), (*q, 2)])
        .collect();
    let mut runs: Vec<Vec<Run>> = configs.iter().map(|_| Vec::new()).collect();
    for round in 0..REPS {
        println!("round {} of {REPS}:", round + 1);
        for ((query, parallelism), r) in configs.iter().zip(runs.iter_mut()) {
            r.push(run_once(b, query, *parallelism)?);
        }
    }
    println!(
        "\nper-core throughput ({EVENTS} events, checkpoints every 1 s, {REPS} interleaved rounds, \
         median; events_per_core_s = events / process CPU seconds):"
    );
    println!(
        "  {:<5} {:>3} {:>14} {:>18} {:>16} {:>8}  target ≥{TARGET_FACTOR}×",
        "query", "p", "events/s", "events/core·s", "nexmark-flink", "ratio"
    );
    let mut all_met = true;
    for ((query, parallelism), r) in configs.iter().zip(&runs) {
        let rate = median(&r.iter().map(|x| x.events_per_s).collect::<Vec<_>>()).unwrap_or(0.0);
        let per_core =
            median(&r.iter().map(|x| x.events_per_core_s).collect::<Vec<_>>()).unwrap_or(0.0);
        let flink = FLINK_PER_CORE
            .iter()
            .find(|(q, _)| q == query)
            .map_or(f64::NAN, |(_, f)| *f);
        let ratio = per_core / flink;
        let met = ratio >= TARGET_FACTOR;
        all_met &= met;
        println!(
            "  {query:<5} {parallelism:>3} {rate:>14.0} {per_core:>18.0} {flink:>16.0} {ratio:>7.1}×  {}",
            crate::bench::verdict(met)
        );
    }
    println!(
        "\nevery query at ≥ {TARGET_FACTOR}× nexmark-flink per core: {}",
        crate::bench::verdict(all_met)
    );
    Ok(())
}
