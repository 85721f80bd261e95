//! Helpers shared by the runtime integration tests: failure injection, test seeds, rule data.

// Each test binary that says `mod support;` compiles this module and uses only some of it, so
// the rest would warn as dead code under `-D warnings`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use weir_runtime::DataStream;
use weir_runtime::source::splitmix64;

// ---------------------------------------------------------------------------------------------
// Proving a restore (shared with the examples' tests).
// ---------------------------------------------------------------------------------------------

#[path = "bounded.rs"]
mod bounded;
#[allow(unused_imports)]
pub use bounded::{Bounded, BoundedCommand, JOB_LIMIT};
#[path = "restored.rs"]
mod restored;
// Each test binary uses one or both.
#[allow(unused_imports)]
pub use restored::{assert_restored, assert_resumed};

// ---------------------------------------------------------------------------------------------
// Failure injection, for any record type.
// ---------------------------------------------------------------------------------------------

// Each test binary uses some of these.
#[allow(unused_imports)]
pub use weir_runtime::testing::{Failures, Injector};

/// `stream` through an operator calling `injector` per record
/// ([`DataStream::inject_failures`]).
pub fn inject<T: weir_network::Data, I: Injector>(
    stream: DataStream<T>,
    injector: &Arc<I>,
) -> DataStream<T> {
    stream.inject_failures(injector)
}

// ---------------------------------------------------------------------------------------------
// Seeds.
// ---------------------------------------------------------------------------------------------

/// The test's seed: `WEIR_TEST_SEED` to reproduce, else a fresh one per run.
pub fn test_seed() -> u64 {
    let seed = std::env::var("WEIR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(42)
        });
    eprintln!("seed={seed} (rerun with WEIR_TEST_SEED={seed})");
    seed
}

// ---------------------------------------------------------------------------------------------
// Broadcast rule data: rules `(color, multiplier)`.
// ---------------------------------------------------------------------------------------------

pub type Rule = (String, u64);

pub fn color(c: u64) -> String {
    format!("color-{c:02}")
}

/// Rule `i` over `rule_colors` colors: its color and multiplier, 1 to 9; every fifth of the
/// second rules is a 0, which removes the color's rule.
pub fn rule(i: u64, rule_colors: u64) -> Rule {
    let multiplier = if i >= rule_colors && i.is_multiple_of(5) {
        0
    } else {
        1 + splitmix64(i ^ 0x5275_6c65) % 9
    };
    (color(i % rule_colors), multiplier)
}

/// How a rule changes a broadcast map.
pub fn apply_rule(map: &mut BTreeMap<String, u64>, (color, multiplier): Rule) {
    if multiplier == 0 {
        map.remove(&color);
    } else {
        map.insert(color, multiplier);
    }
}
