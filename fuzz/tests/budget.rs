//! The CI budget: every fuzz target for a few seconds on a fixed seed (`WEIR_FUZZ_SECONDS`,
//! default 3 per target; `WEIR_FUZZ_SEED` to explore another sequence). A panic, an allocation
//! over the bound or an input over its time fails the test, naming the input's seed.

use std::time::Duration;
use weir_fuzz::harness::{Bounds, Budget};
use weir_fuzz::{report, targets};

fn budget() -> Budget {
    let seconds = std::env::var("WEIR_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    let seed = std::env::var("WEIR_FUZZ_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0xc1);
    Budget {
        inputs: u64::MAX,
        time: Some(Duration::from_secs_f64(seconds)),
        seed,
        bounds: Bounds::default(),
        classify: false,
    }
}

fn fuzz(name: &str) {
    let report = targets::fuzz(name, &budget()).expect("a target of that name");
    println!("{}", report::table(std::slice::from_ref(&report)));
    assert!(
        report.failures.is_empty(),
        "{}",
        report::failures(std::slice::from_ref(&report))
    );
    assert!(
        report.inputs >= 200,
        "{name}: only {} inputs in the budget",
        report.inputs
    );
    // Mutations of valid encodings give both outcomes; one alone means they miss the decoder.
    assert!(
        report.ok > 0 && report.errors > 0,
        "{name}: {} decoded, {} refused",
        report.ok,
        report.errors
    );
}

#[test]
fn metadata() {
    fuzz("metadata");
}

#[test]
fn keyed_snapshots() {
    fuzz("keyed");
}

#[test]
fn channel_state() {
    fuzz("channel-state");
}

#[test]
fn operator_state() {
    fuzz("operator");
}

#[test]
fn codec_envelope() {
    fuzz("codec");
}

#[test]
fn tcp_frames() {
    fuzz("tcp");
}

#[test]
fn cluster_protocol() {
    fuzz("protocol");
}

#[test]
fn identity_frames() {
    fuzz("identity");
}

#[test]
fn every_target_has_a_test_here() {
    let source = include_str!("budget.rs");
    for name in targets::NAMES {
        assert!(
            source.contains(&format!("fuzz(\"{name}\")")),
            "target {name} has no CI budget test"
        );
    }
}
