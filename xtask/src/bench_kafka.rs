//! `cargo xtask bench kafka`: `kafka_word_count` on librdkafka's mock cluster, topic → job →
//! topic at p=2 with 1 s checkpoints: records/s exactly-once against at-least-once, and the
//! end-to-end latency of each (a record's produce time to its `read_committed` visibility).

use crate::lines::{median, parse_fields, run_logged};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Records per throughput run (16 partitions: the mock keeps about 5 MiB per partition).
const RECORDS: u64 = 2_000_000;
const PARTITIONS: &str = "16";
/// Rounds, interleaved (both guarantees once per round).
const REPS: usize = 3;
/// The latency run's rate (records/s) and length (s).
const LATENCY_RATE: u64 = 50_000;
const LATENCY_SECONDS: u64 = 10;
/// Exactly-once throughput must be at least this share of at-least-once's.
const TARGET: f64 = 0.8;
const MODES: [&str; 2] = ["exactly-once", "at-least-once"];

/// Runs `kafka_word_count` with `args`; the fields of its output line that starts with `tag`.
fn fields(
    bin: &Path,
    scratch: &Path,
    tag: &str,
    args: &[&str],
) -> Result<BTreeMap<String, String>> {
    let dir = scratch.join("kafka-checkpoints");
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = Command::new(bin);
    cmd.args(["--mock-cluster", "--partitions", PARTITIONS, "-p", "2"])
        .args(["--checkpoint-interval", "1s", "--checkpoint-dir"])
        .arg(&dir)
        .args(args)
        .env("RUST_LOG", "off");
    let (shown, out) = run_logged(&mut cmd)?;
    let _ = std::fs::remove_dir_all(&dir);
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(tag))
        .with_context(|| format!("`{shown}` printed no `{tag}` line"))?;
    println!("  {tag}{line}");
    parse_fields(line)
}

fn number(fields: &BTreeMap<String, String>, key: &str) -> Result<f64> {
    fields
        .get(key)
        .with_context(|| format!("no {key} in {fields:?}"))?
        .parse()
        .with_context(|| format!("{key} in {fields:?}"))
}

pub fn kafka(bin: &Path, scratch: &Path) -> Result<()> {
    let records = RECORDS.to_string();
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..REPS {
        println!("round {} of {REPS}:", round + 1);
        for mode in MODES {
            let f = fields(
                bin,
                scratch,
                "summary ",
                &["--records", &records, "--delivery", mode],
            )?;
            if number(&f, "records")? as u64 != RECORDS {
                bail!(
                    "{mode} read {} records, not {RECORDS}",
                    number(&f, "records")?
                );
            }
            rates
                .entry(mode)
                .or_default()
                .push(number(&f, "records_per_s")?);
        }
    }
    let mut latency = BTreeMap::new();
    let (rate, seconds) = (LATENCY_RATE.to_string(), LATENCY_SECONDS.to_string());
    for mode in MODES {
        let args = [
            "--delivery",
            mode,
            "--latency-rate",
            &rate,
            "--latency-seconds",
            &seconds,
        ];
        latency.insert(mode, fields(bin, scratch, "latency ", &args)?);
    }
    println!(
        "\nkafka_word_count on the mock cluster ({RECORDS} records, {PARTITIONS} partitions, p=2, \
         1 s checkpoints; median of {REPS} interleaved rounds):"
    );
    let med = |m: &str| median(&rates[m]).unwrap_or(0.0);
    for mode in MODES {
        let l = &latency[mode];
        println!(
            "  {mode:<14} {:>9.0} records/s   latency p50 {} ms  p99 {} ms  (at {LATENCY_RATE}/s \
             for {LATENCY_SECONDS} s)",
            med(mode),
            l.get("p50_ms").map_or("?", String::as_str),
            l.get("p99_ms").map_or("?", String::as_str),
        );
    }
    let ratio = med("exactly-once") / med("at-least-once").max(1.0);
    let verdict = if ratio >= TARGET { "met" } else { "MISSED" };
    println!(
        "  exactly-once / at-least-once throughput: {ratio:.2} (target >= {TARGET}: {verdict})"
    );
    Ok(())
}
