//! `cargo xtask bench wordcount`: `word_count`'s throughput against the bare loop (the same
//! pipeline without the engine), checkpoint overhead, CPU per record, checkpoint latency and
//! recovery time.

use crate::bench::{Bench, Config, Summary, median, mrec, opt_ms, verdict};
use anyhow::{Context, Result};

const RECORDS: u64 = 20_000_000;
const REPS: usize = 5;
/// Records/s at p=2 with 1 s checkpoints over the bare loop's.
const TARGET_BARE_RATIO_P2: f64 = 0.5;
/// Records/s at p=1 with 1 s checkpoints over the bare loop's.
const TARGET_BARE_RATIO_P1: f64 = 0.4;
/// CPU seconds of p=2 with 1 s checkpoints over the bare loop's, for the same records.
const TARGET_CPU_RATIO: f64 = 2.0;
/// 1 - (with 1 s checkpoints / without).
const TARGET_OVERHEAD: f64 = 0.02;
const TARGET_P99_MS: f64 = 20.0;
const TARGET_RECOVERY_MS: f64 = 50.0;

/// The median of one figure of a configuration's runs.
fn median_of(runs: &[Summary], figure: impl Fn(&Summary) -> Option<f64>) -> Option<f64> {
    let values: Vec<f64> = runs.iter().filter_map(figure).collect();
    median(&values)
}

pub fn wordcount(b: &Bench) -> Result<()> {
    // The bare loop, then p ∈ {1, 2} × checkpoints {off, 1s}, REPS rounds. The configurations
    // are interleaved (round after round of all five), so that drift in a shared machine's
    // speed lands on every configuration alike instead of on the ratios.
    let configs: Vec<Config> = [1u32, 2]
        .into_iter()
        .flat_map(|parallelism| {
            [None, Some("1s")].into_iter().map(move |interval| Config {
                records: RECORDS,
                parallelism,
                checkpoint_interval: interval,
                ..Config::default()
            })
        })
        .collect();
    let mut bare: Vec<Summary> = Vec::new();
    let mut runs: Vec<Vec<Summary>> = vec![Vec::new(); configs.len()];
    for _ in 0..REPS {
        bare.push(b.run_bare(RECORDS)?);
        for (cfg, r) in configs.iter().zip(runs.iter_mut()) {
            r.push(b.run(cfg)?);
        }
    }
    let bare_rate = median_of(&bare, |s| Some(s.records_per_s)).context("no bare runs")?;
    let rates =
        |runs: &[Summary]| -> Vec<String> { runs.iter().map(|s| mrec(s.records_per_s)).collect() };
    println!("\nthroughput ({RECORDS} records, {REPS} interleaved rounds, median):");
    println!(
        "  {:<18} {:<50} {:>10} {:>9}  target",
        "config", "runs", "median", "of bare"
    );
    println!(
        "  {:<18} {:<50} {:>10} {:>9}",
        "bare loop",
        rates(&bare).join(" "),
        mrec(bare_rate),
        "1.00"
    );
    let mut medians = std::collections::BTreeMap::new();
    for (cfg, runs) in configs.iter().zip(&runs) {
        let med = median_of(runs, |s| Some(s.records_per_s)).context("no runs")?;
        let ratio = med / bare_rate;
        medians.insert((cfg.parallelism, cfg.checkpoint_interval.is_some()), med);
        let target = match (cfg.parallelism, cfg.checkpoint_interval) {
            (2, Some(_)) => format!(
                ">= {TARGET_BARE_RATIO_P2} of bare  {}",
                verdict(ratio >= TARGET_BARE_RATIO_P2)
            ),
            (1, Some(_)) => format!(
                ">= {TARGET_BARE_RATIO_P1} of bare  {}",
                verdict(ratio >= TARGET_BARE_RATIO_P1)
            ),
            _ => String::new(),
        };
        println!(
            "  {:<18} {:<50} {:>10} {ratio:>9.2}  {target}",
            cfg.label(),
            rates(runs).join(" "),
            mrec(med)
        );
    }

    println!("\ncheckpoint overhead (median with 1s checkpoints / median without):");
    for parallelism in [1u32, 2] {
        let ratio = medians[&(parallelism, true)] / medians[&(parallelism, false)];
        let overhead = 1.0 - ratio;
        println!(
            "  p={parallelism}  ratio {ratio:.3}  overhead {:>5.1}%  target <= {:.0}%  {}",
            overhead * 100.0,
            TARGET_OVERHEAD * 100.0,
            verdict(overhead <= TARGET_OVERHEAD)
        );
    }

    let bare_cpu = median_of(&bare, |s| s.cpu_seconds);
    // The p=2, 1s configuration is the last of `configs`.
    let job_cpu = runs.last().and_then(|r| median_of(r, |s| s.cpu_seconds));
    println!("\nCPU seconds per {RECORDS} records (user + system, whole process, median):");
    match (bare_cpu, job_cpu) {
        (Some(bare_cpu), Some(job_cpu)) => {
            let ratio = job_cpu / bare_cpu.max(0.01);
            println!(
                "  bare loop {bare_cpu:.2}  p=2 1s {job_cpu:.2}  ratio {ratio:.2}  target <= {TARGET_CPU_RATIO}  {}",
                verdict(ratio <= TARGET_CPU_RATIO)
            );
        }
        _ => println!("  not reported (no /proc/self/stat?)"),
    }

    let latency = b.run(&Config {
        records: RECORDS,
        parallelism: 2,
        checkpoint_interval: Some("100ms"),
        ..Config::default()
    })?;
    println!(
        "\ncheckpoint latency (p=2, every 100ms, {} checkpoints):",
        latency.checkpoints
    );
    println!("  p50  {}", opt_ms(latency.checkpoint_p50_ms));
    println!(
        "  p99  {}  target < {TARGET_P99_MS} ms  {}",
        opt_ms(latency.checkpoint_p99_ms),
        latency
            .checkpoint_p99_ms
            .map_or("not reported", |v| verdict(v < TARGET_P99_MS))
    );

    let recovery = b.run(&Config {
        records: RECORDS,
        parallelism: 2,
        checkpoint_interval: Some("100ms"),
        fail_after: Some(10_000_000),
        ..Config::default()
    })?;
    println!(
        "\nrecovery (p=2, every 100ms, one failure after 10000000 records, {} restart(s)):",
        recovery.restarts
    );
    println!(
        "  recovery  {}  target < {TARGET_RECOVERY_MS} ms  {}",
        opt_ms(recovery.recovery_ms),
        recovery
            .recovery_ms
            .map_or("not reported", |v| verdict(v < TARGET_RECOVERY_MS))
    );
    if recovery.restarts == 0 {
        println!("  note: the run reported no restart; was the failure injected?");
    }
    Ok(())
}
