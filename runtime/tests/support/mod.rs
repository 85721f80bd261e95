//! Helpers shared by the runtime integration tests: failure injection, test seeds, rule data.

// Each test binary that says `mod support;` compiles this module and uses only some of it, so
// the rest would warn as dead code under `-D warnings`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use weir_runtime::DataStream;
use weir_runtime::operator::{Chained, OneInputOperator, OpResult, Output};
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

/// What an [`Inject`] operator calls per record; it may panic to inject a failure.
pub trait Injector: Send + Sync + 'static {
    fn record(&self, attempt: u32);
}

/// Fails (panics) once at each threshold of records seen over all subtasks and attempts, and at
/// most once per attempt, so that each injected failure is exactly one restart.
#[derive(Default)]
pub struct Failures {
    seen: AtomicU64,
    thresholds: Vec<u64>,
    /// Sleep 1 ms every this many records (0: never), to slow the job down.
    pace_every: u64,
    /// The next threshold's index (high 32 bits) and the attempt that failed last, plus one
    /// (low 32 bits; 0: none), in one word so that both change together.
    state: AtomicU64,
}

impl Failures {
    pub fn at(thresholds: Vec<u64>) -> Arc<Self> {
        Self::paced(thresholds, 0)
    }

    /// As [`Failures::at`], also sleeping 1 ms every `pace_every` records (0: never).
    pub fn paced(mut thresholds: Vec<u64>, pace_every: u64) -> Arc<Self> {
        thresholds.sort_unstable();
        Arc::new(Failures {
            thresholds,
            pace_every,
            ..Failures::default()
        })
    }

    pub fn record(&self, attempt: u32) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if self.pace_every != 0 && n.is_multiple_of(self.pace_every) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let state = self.state.load(Ordering::SeqCst);
        let (next, failed) = (state >> 32, state & 0xffff_ffff);
        let this = u64::from(attempt) + 1;
        if let Some(&t) = self.thresholds.get(next as usize)
            && n >= t
            && failed < this
            && self
                .state
                .compare_exchange(
                    state,
                    ((next + 1) << 32) | this,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
        {
            panic!(
                "injected failure {} in attempt {attempt} after {n} records",
                next + 1
            );
        }
    }

    pub fn injected(&self) -> usize {
        (self.state.load(Ordering::SeqCst) >> 32) as usize
    }
}

impl Injector for Failures {
    fn record(&self, attempt: u32) {
        Failures::record(self, attempt);
    }
}

/// The identity that injects failures; an operator, to know its attempt.
pub struct Inject<T, I> {
    injector: Arc<I>,
    attempt: u32,
    _t: PhantomData<fn(T)>,
}

impl<T: Send + 'static, I: Injector> OneInputOperator<T> for Inject<T, I> {
    type Out = T;

    fn process(&mut self, record: T, out: &mut dyn Output<T>) -> OpResult {
        self.injector.record(self.attempt);
        out.push(record)
    }
}

/// `stream` through an [`Inject`] operator calling `injector` per record.
pub fn inject<T: weir_network::Data, I: Injector>(
    stream: DataStream<T>,
    injector: &Arc<I>,
) -> DataStream<T> {
    let injector = injector.clone();
    stream.transform::<T>("Inject", move |ctx, next| {
        Box::new(Chained::new(
            Inject {
                injector: injector.clone(),
                attempt: ctx.info.attempt,
                _t: PhantomData,
            },
            next,
        ))
    })
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
