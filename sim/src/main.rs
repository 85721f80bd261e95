//! `weir-sim`: runs seeds of the deterministic simulation and reports the first failures with
//! their replay commands and traces (`cargo xtask chaos sim` runs it).

use anyhow::{Context, Result, bail};
use std::time::Instant;
use weir_core::sim::Mutation;

const USAGE: &str =
    "usage: weir-sim [--seeds N] [--first-seed S] [--mutation NAME] [--trace] [--threads T]";

struct Args {
    seeds: u64,
    first: u64,
    mutation: Option<Mutation>,
    trace: bool,
    threads: usize,
    /// Print each seed's digest (one line per seed) instead of checking: for replays across
    /// processes.
    digest: bool,
}

fn parse() -> Result<Args> {
    let mut args = Args {
        seeds: 100,
        first: 0,
        mutation: None,
        trace: false,
        digest: false,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--seeds" => args.seeds = value("--seeds")?.parse().context("--seeds: a count")?,
            "--first-seed" => {
                args.first = value("--first-seed")?
                    .parse()
                    .context("--first-seed: a number")?
            }
            "--mutation" => {
                let name = value("--mutation")?;
                let m = Mutation::from_name(&name).with_context(|| {
                    let names: Vec<_> = Mutation::ALL.iter().map(|m| m.name()).collect();
                    format!("no mutation {name:?}; there are {}", names.join(", "))
                })?;
                if !weir_core::sim::MUTATIONS_BUILT_IN {
                    bail!("mutations exist only in debug builds: run without --release");
                }
                args.mutation = Some(m);
            }
            "--threads" => {
                args.threads = value("--threads")?.parse().context("--threads: a count")?
            }
            "--trace" => args.trace = true,
            "--digest" => args.digest = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    Ok(args)
}

fn main() -> Result<()> {
    let args = parse()?;
    if args.digest {
        for seed in args.first..args.first.saturating_add(args.seeds) {
            let o = weir_sim::run_seed(seed, args.mutation);
            println!(
                "seed {seed} digest {:016x} decisions {}",
                o.digest, o.decisions
            );
        }
        return Ok(());
    }
    let started = Instant::now();
    let report = weir_sim::run_seeds(args.first, args.seeds, args.mutation, args.threads);
    let elapsed = started.elapsed();
    for o in report.failed.iter().take(3) {
        println!("\nseed {} FAILED:", o.scenario.seed);
        for v in &o.violations {
            println!("  {v}");
        }
        println!("  replay: {}", o.replay_command());
        if args.trace || report.failed.len() == 1 {
            println!("  trace:");
            for line in &o.trace {
                println!("    {line}");
            }
        }
    }
    if args.trace && report.failed.is_empty() && args.seeds == 1 {
        let o = weir_sim::run_seed(args.first, args.mutation);
        for line in &o.trace {
            println!("  {line}");
        }
    }
    println!(
        "\nweir-sim: {} schedules (seeds {}..{}) in {:.1} s on {} threads ({:.0} per minute): \
         {} passed, {} failed; {} task failures injected, {} task managers lost ({} crashed, {} \
         cut off; {} deployments short of slots), {} restarts, {} checkpoints completed, {:.1} s \
         of virtual time",
        report.runs,
        args.first,
        args.first + args.seeds,
        elapsed.as_secs_f64(),
        args.threads,
        report.runs as f64 / elapsed.as_secs_f64().max(1e-9) * 60.0,
        report.runs - report.failed.len() as u64,
        report.failed.len(),
        report.failures,
        report.task_managers_lost.0 + report.task_managers_lost.1,
        report.task_managers_lost.0,
        report.task_managers_lost.1,
        report.no_resources,
        report.restarts,
        report.checkpoints,
        report.virtual_time.as_secs_f64(),
    );
    if !report.failed.is_empty() {
        eprintln!(
            "weir-sim: {} of {} schedules broke an invariant",
            report.failed.len(),
            report.runs
        );
        std::process::exit(1);
    }
    Ok(())
}
