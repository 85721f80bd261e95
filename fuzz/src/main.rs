//! `weir-fuzz`: runs the fuzz targets (`cargo xtask chaos fuzz` runs it in release) or replays
//! one input from its seed.
//!
//! ```text
//! weir-fuzz [--inputs N] [--seconds S] [--seed S] [--refusals] [--target NAME]...
//! weir-fuzz --target NAME --replay SEED
//! ```
//!
//! `--inputs` is the total over the targets run (default 10 000 000, split evenly), `--seconds`
//! caps each target's time, `--seed` seeds the run (inputs are the same for the same seed),
//! `--refusals` lists each target's most frequent errors (where the decoders refused inputs).
//! Exits with 1 when any input broke a rule, 2 on bad arguments, 3 when the watchdog saw a hang.

use std::process::ExitCode;
use std::time::{Duration, Instant};
use weir_fuzz::harness::{Bounds, Budget};
use weir_fuzz::{report, targets};

/// The default total of inputs.
const DEFAULT_INPUTS: u64 = 10_000_000;
/// The default seed of a run.
const DEFAULT_SEED: u64 = 0x5745_4952_4655_5a5a;

struct Args {
    inputs: u64,
    seconds: Option<f64>,
    seed: u64,
    targets: Vec<String>,
    replay: Option<u64>,
    refusals: bool,
}

fn number(s: &str) -> Result<u64, String> {
    let s = s.replace('_', "");
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("`{s}` is not a number: {e}"))
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        inputs: DEFAULT_INPUTS,
        seconds: None,
        seed: DEFAULT_SEED,
        targets: Vec::new(),
        replay: None,
        refusals: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--inputs" => out.inputs = number(value()?)?,
            "--seconds" => {
                let v = value()?;
                out.seconds = Some(v.parse().map_err(|e| format!("`{v}`: {e}"))?);
            }
            "--seed" => out.seed = number(value()?)?,
            "--target" => {
                let t = value()?;
                if !targets::NAMES.contains(&t.as_str()) {
                    return Err(format!(
                        "no target `{t}`; the targets are {}",
                        targets::NAMES.join(", ")
                    ));
                }
                out.targets.push(t.clone());
            }
            "--replay" => out.replay = Some(number(value()?)?),
            "--refusals" => out.refusals = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if out.targets.is_empty() {
        out.targets = targets::NAMES.iter().map(|s| s.to_string()).collect();
    }
    Ok(out)
}

fn replay(target: &str, seed: u64) -> ExitCode {
    let bounds = Bounds::default();
    let Some((input, checked)) = targets::replay(target, seed, bounds.hang) else {
        eprintln!("weir-fuzz: target {target} has no seeds");
        return ExitCode::FAILURE;
    };
    println!("target {target}, input seed {seed:#018x}\ninput: {input}");
    println!(
        "outcome: {:?}\ntook {:?}, peak {} bytes, largest allocation {} bytes",
        checked.outcome, checked.took, checked.usage.peak, checked.usage.largest
    );
    let problems = checked.problems(&bounds);
    if problems.is_empty() {
        println!("passes");
        ExitCode::SUCCESS
    } else {
        println!("FAILS: {}", problems.join("; "));
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("weir-fuzz: {e}");
            }
            eprintln!(
                "usage: weir-fuzz [--inputs N] [--seconds S] [--seed S] [--refusals] \
                 [--target NAME]... [--replay SEED]\ntargets: {}",
                targets::NAMES.join(", ")
            );
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = args.replay {
        let [target] = args.targets.as_slice() else {
            eprintln!("weir-fuzz: --replay needs exactly one --target");
            return ExitCode::from(2);
        };
        return replay(target, seed);
    }
    let per_target = args.inputs.div_ceil(args.targets.len() as u64);
    let budget = Budget {
        inputs: per_target,
        time: args.seconds.map(Duration::from_secs_f64),
        seed: args.seed,
        bounds: Bounds::default(),
        classify: args.refusals,
    };
    println!(
        "weir-fuzz: {} targets, {per_target} inputs each, seed {:#018x}; bounds: {} per \
         allocation and peak, {:?} per input",
        args.targets.len(),
        args.seed,
        report::bytes(budget.bounds.alloc),
        budget.bounds.time
    );
    let started = Instant::now();
    let mut reports = Vec::new();
    for name in &args.targets {
        let Some(r) = targets::fuzz(name, &budget) else {
            continue;
        };
        println!(
            "  {name}: {} inputs ({} ok, {} errors, {} failures) in {:.1}s",
            r.inputs,
            r.ok,
            r.errors,
            r.failure_count,
            r.elapsed.as_secs_f64()
        );
        for (kind, n) in r.refusals.iter().take(300) {
            println!("    {n:>9}  {kind}");
        }
        reports.push(r);
    }
    println!("\n{}", report::table(&reports));
    let failures = report::failures(&reports);
    println!(
        "weir-fuzz: {} inputs in {:.1}s",
        reports.iter().map(|r| r.inputs).sum::<u64>(),
        started.elapsed().as_secs_f64()
    );
    if failures.is_empty() {
        println!("weir-fuzz: no input panicked, over-allocated or overran its time");
        ExitCode::SUCCESS
    } else {
        println!("{failures}");
        ExitCode::FAILURE
    }
}
