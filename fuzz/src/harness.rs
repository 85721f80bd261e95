//! The mutation loop: generates each input from its seed (a valid seed encoding, mutated), runs
//! the target's decoder on it under `catch_unwind`, and judges the outcome against the bounds.
//!
//! An input passes when the decoder returns (a value or an error) without panicking, within
//! [`Bounds::time`], having allocated at most [`Bounds::alloc`] bytes in one allocation and at
//! most that much live at once beyond what was live before it. An input that runs past
//! [`Bounds::hang`] (a decoder that never returns) is reported by a watchdog thread, which then
//! ends the process: a hang cannot be interrupted.
//!
//! The allocation bound is absolute, not a multiple of the input: the inputs are at most a few
//! hundred KiB. One decoder has a documented bound of its own that can exceed it on large
//! inputs: a compressed keyed section that genuinely expands may take 255× its stored bytes
//! (lz4) or 32768× (zstd), at most 1 GiB; the seeds' sections are far too small for that.

use crate::alloc::{self, Usage};
use crate::rng::{Rng, input_seed};
use crate::watchdog;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;
use std::time::{Duration, Instant};

/// A fuzz target: a decoder, the valid encodings it starts from, and how to mutate them.
pub trait Target {
    /// What the decoder reads (bytes, with whatever context the decoder is handed).
    type Input: Clone;

    /// The target's name, as `--target` takes it.
    fn name(&self) -> &'static str;

    /// Valid encodings made with the crates' own encoders: each must decode.
    fn seeds(&self) -> Vec<Self::Input>;

    /// Applies one random mutation; `corpus` holds the seeds, to splice from.
    fn mutate(&self, input: &mut Self::Input, corpus: &[Self::Input], rng: &mut Rng);

    /// Brings a mutated input into the form [`run`](Self::run) reads (encodes what mutations
    /// left structured). Not measured.
    fn finish(&self, input: &mut Self::Input) {
        let _ = input;
    }

    /// Runs the production decoder, and what a reader does next with what it decoded.
    fn run(&self, input: &Self::Input) -> Result<(), String>;

    /// The input, for a report: its bytes in hex, with any context.
    fn describe(&self, input: &Self::Input) -> String;
}

/// What an input may cost.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// The most bytes one allocation may take, and the most the input may add to the bytes live.
    pub alloc: usize,
    /// The longest one input may take.
    pub time: Duration,
    /// How long an input may run before the watchdog ends the process.
    pub hang: Duration,
}

impl Default for Bounds {
    /// 64 MiB; 1 s (10 s in an unoptimized build); a minute.
    fn default() -> Bounds {
        Bounds {
            alloc: 64 << 20,
            time: if cfg!(debug_assertions) {
                Duration::from_secs(10)
            } else {
                Duration::from_secs(1)
            },
            hang: Duration::from_secs(60),
        }
    }
}

/// How much to fuzz.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// The most mutated inputs to run.
    pub inputs: u64,
    /// Stop once this long has passed, whatever the count.
    pub time: Option<Duration>,
    /// The run's seed: input `i` of target `t` is generated from `input_seed(seed, t, i)`.
    pub seed: u64,
    /// What an input may cost.
    pub bounds: Bounds,
    /// Whether to count the decoders' errors by kind ([`Report::refusals`]).
    pub classify: bool,
}

/// An input that broke a rule.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The input's seed (`None`: a seed of the corpus, unmutated, `corpus` its index).
    pub seed: Option<u64>,
    /// Its index in the corpus when `seed` is `None`.
    pub corpus: usize,
    /// What went wrong.
    pub what: String,
    /// The input.
    pub input: String,
}

/// The outcome of fuzzing one target.
#[derive(Clone, Debug)]
pub struct Report {
    /// The target.
    pub target: &'static str,
    /// The seed encodings it started from.
    pub corpus: usize,
    /// Mutated inputs run.
    pub inputs: u64,
    /// Of those, how many decoded.
    pub ok: u64,
    /// Of those, how many the decoder refused with an error.
    pub errors: u64,
    /// The slowest input, and its seed.
    pub slowest: (Duration, u64),
    /// The input that added the most live bytes, and its seed.
    pub peak: (usize, u64),
    /// The largest single allocation, and its seed.
    pub largest: (usize, u64),
    /// How long the run took.
    pub elapsed: Duration,
    /// Inputs that broke a rule (the first few).
    pub failures: Vec<Failure>,
    /// How many broke one.
    pub failure_count: u64,
    /// With [`Budget::classify`]: the decoders' errors by kind (digits masked), most frequent
    /// first, which shows where the mutated inputs were refused.
    pub refusals: Vec<(String, u64)>,
}

/// The most failures a report keeps.
const KEPT_FAILURES: usize = 10;

impl Report {
    fn new(target: &'static str, corpus: usize) -> Report {
        Report {
            target,
            corpus,
            inputs: 0,
            ok: 0,
            errors: 0,
            slowest: (Duration::ZERO, 0),
            peak: (0, 0),
            largest: (0, 0),
            elapsed: Duration::ZERO,
            failures: Vec::new(),
            failure_count: 0,
            refusals: Vec::new(),
        }
    }

    fn fail(&mut self, failure: Failure) {
        self.failure_count += 1;
        if self.failures.len() < KEPT_FAILURES {
            self.failures.push(failure);
        }
    }
}

/// One input's run.
#[derive(Clone, Debug)]
pub struct Checked {
    /// `Ok(result)` when the decoder returned; `Err(panic message)` when it panicked.
    pub outcome: Result<Result<(), String>, String>,
    /// How long it took.
    pub took: Duration,
    /// What it allocated.
    pub usage: Usage,
}

impl Checked {
    /// Every rule this run broke, in words; empty when it passed.
    pub fn problems(&self, bounds: &Bounds) -> Vec<String> {
        let mut out = Vec::new();
        if let Err(panic) = &self.outcome {
            out.push(format!("the decoder panicked: {panic}"));
        }
        if self.usage.largest > bounds.alloc {
            out.push(format!(
                "one allocation of {} bytes, over the bound of {}",
                self.usage.largest, bounds.alloc
            ));
        }
        if self.usage.peak > bounds.alloc {
            out.push(format!(
                "{} bytes live at the peak, over the bound of {}",
                self.usage.peak, bounds.alloc
            ));
        }
        if self.took > bounds.time {
            out.push(format!(
                "took {:?}, over the bound of {:?}",
                self.took, bounds.time
            ));
        }
        out
    }
}

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that keeps the message of a panic inside a decoder for the
/// report instead of printing it; other panics print as before.
fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CAPTURING.with(Cell::get) {
                PANIC.with(|p| *p.borrow_mut() = Some(info.to_string()));
            } else {
                previous(info);
            }
        }));
    });
}

/// Input `seed` of target `t`: a seed of the corpus, mutated one or more times.
pub fn generate<T: Target>(t: &T, corpus: &[T::Input], seed: u64) -> Option<T::Input> {
    let mut rng = Rng::new(seed);
    let mut input = rng.pick(corpus)?.clone();
    // One mutation half the time, two a quarter, ... at most eight.
    let rounds = 1 + (rng.next_u64().trailing_zeros() as usize).min(7);
    for _ in 0..rounds {
        t.mutate(&mut input, corpus, &mut rng);
    }
    t.finish(&mut input);
    Some(input)
}

/// Runs `t` on `input`, measuring it; `seed` names it if an allocation is refused.
pub fn check<T: Target>(t: &T, input: &T::Input, seed: u64, slot: &watchdog::Slot) -> Checked {
    install_panic_hook();
    alloc::set_current(t.name(), seed);
    slot.begin(seed);
    CAPTURING.with(|c| c.set(true));
    let mark = alloc::start();
    let start = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| t.run(input)));
    let took = start.elapsed();
    let usage = alloc::usage(mark);
    CAPTURING.with(|c| c.set(false));
    slot.end();
    let outcome = result.map_err(|payload| {
        PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| {
            payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string())
        })
    });
    Checked {
        outcome,
        took,
        usage,
    }
}

/// Fuzzes `t` within `budget`: every seed of the corpus first (each must decode), then the
/// mutated inputs.
pub fn fuzz<T: Target>(t: &T, budget: &Budget) -> Report {
    let started = Instant::now();
    let corpus = t.seeds();
    let slot = watchdog::register(t.name(), budget.bounds.hang);
    let mut report = Report::new(t.name(), corpus.len());
    if corpus.is_empty() {
        report.fail(Failure {
            seed: None,
            corpus: 0,
            what: "the target has no seed encodings".to_string(),
            input: String::new(),
        });
    }
    for (i, input) in corpus.iter().enumerate() {
        let checked = check(t, input, 0, &slot);
        let mut problems = checked.problems(&budget.bounds);
        if let Ok(Err(e)) = &checked.outcome {
            problems.push(format!("a seed encoding does not decode: {e}"));
        }
        if !problems.is_empty() {
            report.fail(Failure {
                seed: None,
                corpus: i,
                what: problems.join("; "),
                input: t.describe(input),
            });
        }
    }
    let mut refusals: HashMap<String, u64> = HashMap::new();
    for index in 0..budget.inputs {
        if index % 64 == 0 && budget.time.is_some_and(|limit| started.elapsed() >= limit) {
            break;
        }
        let seed = input_seed(budget.seed, t.name(), index);
        // A panic here is the fuzzer's own bug, not the decoder's: reported, and the run goes on.
        let input = match catch_unwind(AssertUnwindSafe(|| generate(t, &corpus, seed))) {
            Ok(Some(input)) => input,
            Ok(None) => break,
            Err(_) => {
                report.fail(Failure {
                    seed: Some(seed),
                    corpus: 0,
                    what: "the fuzzer's mutation panicked (a bug of weir-fuzz)".to_string(),
                    input: String::new(),
                });
                continue;
            }
        };
        let checked = check(t, &input, seed, &slot);
        report.inputs += 1;
        match &checked.outcome {
            Ok(Ok(())) => report.ok += 1,
            Ok(Err(e)) => {
                report.errors += 1;
                if budget.classify {
                    *refusals.entry(kind_of(e)).or_default() += 1;
                }
            }
            Err(_) => {}
        }
        if checked.took > report.slowest.0 {
            report.slowest = (checked.took, seed);
        }
        if checked.usage.peak > report.peak.0 {
            report.peak = (checked.usage.peak, seed);
        }
        if checked.usage.largest > report.largest.0 {
            report.largest = (checked.usage.largest, seed);
        }
        let problems = checked.problems(&budget.bounds);
        if !problems.is_empty() {
            report.fail(Failure {
                seed: Some(seed),
                corpus: 0,
                what: problems.join("; "),
                input: t.describe(&input),
            });
        }
    }
    report.elapsed = started.elapsed();
    report.refusals = refusals.into_iter().collect();
    report
        .refusals
        .sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    report
}

/// An error's kind: its message with every run of digits as `#`, cut at 100 characters.
fn kind_of(error: &str) -> String {
    let mut out = String::new();
    let mut digits = false;
    for c in error.chars().take(100) {
        if c.is_ascii_digit() {
            if !digits {
                out.push('#');
            }
            digits = true;
        } else {
            out.push(c);
            digits = false;
        }
    }
    out
}

/// Generates input `seed` of `t` again and runs it: its description and its run.
pub fn replay<T: Target>(t: &T, seed: u64, hang: Duration) -> Option<(String, Checked)> {
    let corpus = t.seeds();
    let input = generate(t, &corpus, seed)?;
    let slot = watchdog::register(t.name(), hang);
    let checked = check(t, &input, seed, &slot);
    Some((t.describe(&input), checked))
}

/// `bytes` in lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoder with a planted panic, over-allocation and slowness, keyed by the first byte.
    struct Planted;

    impl Target for Planted {
        type Input = Vec<u8>;

        fn name(&self) -> &'static str {
            "planted"
        }

        fn seeds(&self) -> Vec<Vec<u8>> {
            vec![vec![0, 1, 2, 3]]
        }

        fn mutate(&self, input: &mut Vec<u8>, _: &[Vec<u8>], rng: &mut Rng) {
            input[0] = rng.below(8) as u8;
        }

        fn run(&self, input: &Vec<u8>) -> Result<(), String> {
            match input.first() {
                Some(1) => panic!("planted panic"),
                Some(2) => {
                    let v: Vec<u8> = Vec::with_capacity(3 << 20);
                    Err(format!("allocated {}", v.capacity()))
                }
                Some(3) => {
                    std::thread::sleep(Duration::from_millis(30));
                    Ok(())
                }
                Some(4..) => Err("refused".to_string()),
                _ => Ok(()),
            }
        }

        fn describe(&self, input: &Vec<u8>) -> String {
            hex(input)
        }
    }

    #[test]
    fn panics_allocations_and_slow_inputs_are_reported_with_their_seed() {
        let budget = Budget {
            inputs: 200,
            time: None,
            seed: 5,
            classify: true,
            bounds: Bounds {
                alloc: 1 << 20,
                time: Duration::from_millis(20),
                hang: Duration::from_secs(60),
            },
        };
        let report = fuzz(&Planted, &budget);
        assert_eq!(report.inputs, 200);
        assert!(report.ok > 0 && report.errors > 0, "{report:?}");
        assert!(report.failure_count > 0);
        let whats: Vec<&str> = report.failures.iter().map(|f| f.what.as_str()).collect();
        assert!(
            whats.iter().any(|w| w.contains("planted panic")),
            "{whats:?}"
        );
        assert!(report.largest.0 >= 3 << 20);
        assert!(report.slowest.0 >= Duration::from_millis(30));
        assert!(
            report
                .refusals
                .iter()
                .any(|(kind, _)| kind == "allocated #"),
            "{:?}",
            report.refusals
        );
        // Every failure replays from its seed to the same input and the same problem.
        for failure in &report.failures {
            let seed = failure.seed.expect("a mutated input");
            let (input, checked) = replay(&Planted, seed, budget.bounds.hang).unwrap();
            assert_eq!(input, failure.input);
            assert!(!checked.problems(&budget.bounds).is_empty());
        }
    }

    #[test]
    fn hex_is_lowercase_pairs() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }
}
