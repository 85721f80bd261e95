//! The summary of a fuzzing run: one line per target (inputs, decoded, errors, failures,
//! slowest input and peak allocation, each with its seed), and the failures in full.

use crate::harness::Report;
use std::fmt::Write;
use std::time::Duration;

/// `bytes` for people: B, KiB or MiB.
pub fn bytes(bytes: usize) -> String {
    match bytes {
        b if b < 1 << 10 => format!("{b} B"),
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
    }
}

/// A duration for people: µs or ms.
pub fn time(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0}µs")
    } else {
        format!("{:.1}ms", us / 1000.0)
    }
}

/// The table of `reports`, with a total line.
pub fn table(reports: &[Report]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>10} {:>10} {:>10} {:>8} {:>9}  {:<30} {:<30} {:>8}",
        "target",
        "inputs",
        "ok",
        "errors",
        "failures",
        "inputs/s",
        "slowest (seed)",
        "peak alloc / largest (seed)",
        "seconds"
    );
    for r in reports {
        let rate = r.inputs as f64 / r.elapsed.as_secs_f64().max(1e-9);
        let _ = writeln!(
            out,
            "{:<14} {:>10} {:>10} {:>10} {:>8} {:>9.0}  {:<30} {:<30} {:>8.1}",
            r.target,
            r.inputs,
            r.ok,
            r.errors,
            r.failure_count,
            rate,
            format!("{} ({:#018x})", time(r.slowest.0), r.slowest.1),
            format!(
                "{} / {} ({:#018x})",
                bytes(r.peak.0),
                bytes(r.largest.0),
                r.peak.1
            ),
            r.elapsed.as_secs_f64()
        );
    }
    let sum = |f: fn(&Report) -> u64| reports.iter().map(f).sum::<u64>();
    let seconds: f64 = reports.iter().map(|r| r.elapsed.as_secs_f64()).sum();
    let _ = writeln!(
        out,
        "{:<14} {:>10} {:>10} {:>10} {:>8} {:>9.0}  {:<30} {:<30} {:>8.1}",
        "total",
        sum(|r| r.inputs),
        sum(|r| r.ok),
        sum(|r| r.errors),
        sum(|r| r.failure_count),
        sum(|r| r.inputs) as f64 / seconds.max(1e-9),
        "",
        "",
        seconds
    );
    out
}

/// Every kept failure of `reports`, with its seed, what went wrong and the input.
pub fn failures(reports: &[Report]) -> String {
    let mut out = String::new();
    for r in reports {
        for f in &r.failures {
            let which = match f.seed {
                Some(seed) => format!(
                    "input seed {seed:#018x} (replay: cargo xtask chaos fuzz --target {} \
                     --replay {seed:#018x})",
                    r.target
                ),
                None => format!("seed encoding #{} of the corpus, unmutated", f.corpus),
            };
            let _ = writeln!(
                out,
                "FAILURE {}: {which}\n  {}\n  input: {}",
                r.target, f.what, f.input
            );
        }
        if r.failure_count > r.failures.len() as u64 {
            let _ = writeln!(
                out,
                "  ... and {} more failures of {}",
                r.failure_count - r.failures.len() as u64,
                r.target
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_naturally() {
        assert_eq!(bytes(12), "12 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(time(Duration::from_micros(42)), "42µs");
        assert_eq!(time(Duration::from_micros(4200)), "4.2ms");
    }
}
