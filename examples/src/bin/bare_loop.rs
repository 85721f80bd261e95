//! `bare_loop`: the word count without the engine, the yardstick of `cargo xtask bench`: the
//! same records (the job's generator), `to_string`, split on whitespace, and a running sum per
//! word in a `HashMap<String, i64>`, in one thread, with the same allocator as `word_count`.
//! It prints the totals and a `summary:` line in `word_count`'s format.

use std::collections::HashMap;
use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `--records N` (default 20M) and `--seed S` (default 42, as `word_count`'s).
fn parse_args() -> Result<(u64, u64), String> {
    let (mut records, mut seed) = (20_000_000u64, 42u64);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let parsed: u64 = value
            .parse()
            .map_err(|e| format!("{flag} {value:?}: {e}"))?;
        match flag.as_str() {
            "--records" => records = parsed,
            "--seed" => seed = parsed,
            _ => {
                return Err(format!(
                    "unknown flag {flag}: expected --records N or --seed S"
                ));
            }
        }
    }
    Ok((records, seed))
}

fn main() -> ExitCode {
    let (records, seed) = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::from(2);
        }
    };
    let generator = weir_examples::generator(seed, weir_examples::DIGITS);
    let start = Instant::now();
    let mut sums: HashMap<String, i64> = HashMap::new();
    for i in 0..records {
        let line = black_box(generator.value(i)).to_string();
        for word in line.split_whitespace() {
            match sums.get_mut(word) {
                Some(sum) => *sum += 1,
                None => {
                    sums.insert(word.to_string(), 1);
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mut totals: Vec<_> = black_box(sums).into_iter().collect();
    totals.sort();
    let line: Vec<String> = totals.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("totals: {}", line.join(" "));
    let cpu = weir_examples::process_cpu_seconds()
        .map_or_else(String::new, |c| format!(" cpu_seconds={c:.2}"));
    println!(
        "summary: records={records} seconds={secs:.3} records_per_s={:.0} checkpoints=0 restarts=0{cpu}",
        records as f64 / secs.max(1e-9)
    );
    ExitCode::SUCCESS
}
