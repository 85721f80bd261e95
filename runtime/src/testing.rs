//! Testing exactly-once in one's own job: [`Failures`] injected at chosen records
//! ([`DataStream::inject_failures`]), a [`Gate`] that holds records (backpressure a test
//! controls, not a race between a busy sink and its sources) and a [`GateDriver`] that holds
//! each checkpoint's barrier at it. Weir's own tests use these; so can a user's: judge the
//! output of a job with failures against one computed without the engine.
//!
//! ```no_run
//! # async fn demo() -> Result<(), weir_runtime::JobError> {
//! use weir_runtime::testing::Failures;
//! use weir_runtime::{RestartStrategy, StreamEnvironment};
//! let env = StreamEnvironment::new();
//! env.set_parallelism(2)
//!     .enable_checkpointing(std::time::Duration::from_millis(20))
//!     .set_restart_strategy(RestartStrategy::FixedDelay {
//!         attempts: 3,
//!         delay: std::time::Duration::ZERO,
//!     });
//! // Fail once after 300,000 and once after 700,000 records, over all subtasks.
//! let failures = Failures::at(vec![300_000, 700_000]);
//! let totals = env
//!     .from_generator(Some(1_000_000), |i| (i % 7, 1i64))
//!     .inject_failures(&failures)
//!     .key_by(|t: &(u64, i64)| &t.0)
//!     .sum()
//!     .latest_per_key();
//! let result = env.execute().await?;
//! assert_eq!(failures.injected(), 2);
//! assert_eq!(result.restarts, 2);
//! // Exactly once: each key counted 1,000,000 / 7 times (or one more), as without failures.
//! # Ok(()) }
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), weir_runtime::JobError> {
//! use weir_runtime::testing::{Gate, GateDriver};
//! use weir_runtime::{JobClient, StreamEnvironment};
//! let env = StreamEnvironment::new();
//! env.set_parallelism(2).enable_checkpointing(std::time::Duration::from_millis(10));
//! let gate = Gate::closed();
//! let sums = env
//!     .from_generator(Some(100_000), |i| (i % 7, 1i64))
//!     .key_by(|t: &(u64, i64)| &t.0)
//!     .sum();
//! let committed = sums.through_gate(&gate).collect();
//! let client = JobClient::default();
//! // The sum-and-sink subtasks (2) wait at the gate; let 1,000 records through per checkpoint.
//! let driver = GateDriver::start(client.clone(), gate, 2, 1_000);
//! let result = env.execute_with(client).await?;
//! let held = driver.stop().await; // the checkpoints whose barriers waited at the gate
//! # Ok(()) }
//! ```

use crate::CheckpointStatus;
use crate::env::DataStream;
use crate::job::JobClient;
use crate::operator::{Cancellation, Chained, OneInputOperator, OpResult, Output};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
use weir_network::Data;

/// Backpressure that a test controls rather than a pause per record: while the gate is
/// closed, records wait at it (placed before a sink, say) and everything upstream fills its buffers and
/// blocks; the test lets records through when what it wanted to happen under backpressure has
/// happened (for example, an unaligned barrier has overtaken the records queued at the gate).
#[derive(Debug, Default)]
pub struct Gate {
    /// Records that may still pass: 0 while closed, `u64::MAX` when open for good.
    permits: Mutex<u64>,
    changed: Condvar,
    /// Records that passed.
    passed: AtomicU64,
}

impl Gate {
    /// A gate that starts closed.
    pub fn closed() -> Arc<Self> {
        Arc::new(Gate::default())
    }

    /// Lets every waiting and later record through.
    pub fn open(&self) {
        self.set(u64::MAX);
    }

    /// Lets the next `records` records through, then closes by itself.
    pub fn open_for(&self, records: u64) {
        self.set(records);
    }

    /// Holds the records that come next.
    pub fn close(&self) {
        self.set(0);
    }

    /// Whether the next record would pass.
    pub fn is_open(&self) -> bool {
        *self.permits.lock().unwrap_or_else(PoisonError::into_inner) > 0
    }

    /// Records that passed so far.
    pub fn passed(&self) -> u64 {
        self.passed.load(Ordering::SeqCst)
    }

    fn set(&self, permits: u64) {
        *self.permits.lock().unwrap_or_else(PoisonError::into_inner) = permits;
        self.changed.notify_all();
    }

    /// Waits until a record may pass, or the task is cancelled (checked every 10 ms). The
    /// subtask has a thread of its own (see `gateway::SubtaskHandle`), so a closed gate holds
    /// up no other subtask. (A simulation, whose subtasks share one thread, uses no gate.)
    fn pass(&self, cancellation: &Cancellation) -> OpResult {
        let mut permits = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        while *permits == 0 {
            cancellation.check()?;
            permits = self
                .changed
                .wait_timeout(permits, Duration::from_millis(10))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        if *permits != u64::MAX {
            *permits -= 1;
        }
        self.passed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// The operator of a [`Gate`].
struct GateOperator {
    gate: Arc<Gate>,
    cancellation: Cancellation,
}

impl<T: Send + 'static> OneInputOperator<T> for GateOperator {
    type Out = T;

    fn process(&mut self, record: T, out: &mut dyn Output<T>) -> OpResult {
        self.gate.pass(&self.cancellation)?;
        out.push(record)
    }
}

impl<T: Data> DataStream<T> {
    /// This stream through `gate` (chained: one [`Gate`] for all its subtasks), which holds
    /// records while it is closed.
    pub fn through_gate(self, gate: &Arc<Gate>) -> DataStream<T> {
        let gate = gate.clone();
        self.transform::<T>("Gate", move |ctx, next| {
            let gate = GateOperator {
                gate: gate.clone(),
                cancellation: ctx.info.cancellation.clone(),
            };
            Box::new(Chained::new(gate, next))
        })
    }
}

/// Drives a closed [`Gate`] while a job runs, in rounds: it waits for an in-progress
/// checkpoint that every task but the `gated` subtasks (those the gate blocks) has acknowledged.
/// That barrier now waits in the gated subtasks' inputs with the records queued there behind it
/// (aligned) or overtaken by it (unaligned). It then lets `per_round` records through, after
/// which the gate closes by itself.
///
/// When no such checkpoint comes within a second (the input ended, or a restart is under way)
/// it lets a round through anyway, so that the job cannot stall; that decides no outcome.
pub struct GateDriver {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<Vec<u64>>>,
}

impl Drop for GateDriver {
    /// A driver dropped without [`stop`](GateDriver::stop) stops too (its task then opens the
    /// gate for good), so that a failing test does not leave a gate closed.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl GateDriver {
    /// Starts driving `gate`, which blocks `gated` subtasks of the job `client` watches, on the
    /// current tokio runtime.
    pub fn start(client: JobClient, gate: Arc<Gate>, gated: usize, per_round: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            let mut closed_since = Instant::now();
            while !stopped.load(Ordering::SeqCst) {
                if gate.is_open() {
                    closed_since = Instant::now();
                } else {
                    let last = held.last().copied().unwrap_or(0);
                    let at_gate = client.checkpoint_stats().into_iter().find(|s| {
                        s.status == CheckpointStatus::InProgress
                            && s.id.0 > last
                            && s.num_acknowledged + gated == s.num_subtasks
                    });
                    if let Some(s) = at_gate {
                        held.push(s.id.0);
                        gate.open_for(per_round);
                        closed_since = Instant::now();
                    } else if closed_since.elapsed() > Duration::from_secs(1) {
                        gate.open_for(per_round);
                        closed_since = Instant::now();
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            gate.open();
            held
        });
        GateDriver {
            stop,
            task: Some(task),
        }
    }

    /// Stops driving (the gate is left open for good) and returns the ids of the checkpoints
    /// whose barriers it held at the gate, in order.
    pub async fn stop(mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::SeqCst);
        match self.task.take() {
            Some(task) => task.await.unwrap_or_default(),
            None => Vec::new(),
        }
    }
}

/// What [`DataStream::inject_failures`] calls per record, with the subtask's attempt (0 for the
/// first run, one more after each restart); it panics to fail the task.
pub trait Injector: Send + Sync + 'static {
    /// One record passes, in a subtask of `attempt`.
    fn record(&self, attempt: u32);
}

/// Fails (panics) once at each threshold of records seen over all subtasks and attempts, and at
/// most once per attempt, so that each injected failure is exactly one restart. A threshold
/// passed in an attempt that already failed fires in the next one. It counts in one process:
/// on a cluster, each process has its own.
#[derive(Debug, Default)]
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
    /// Failures at each of `thresholds` (records seen, over all subtasks and attempts).
    pub fn at(thresholds: Vec<u64>) -> Arc<Self> {
        Self::paced(thresholds, 0)
    }

    /// As [`Failures::at`], also sleeping 1 ms every `pace_every` records (0: never), so that
    /// a short job lasts long enough for checkpoints to complete between the failures.
    pub fn paced(mut thresholds: Vec<u64>, pace_every: u64) -> Arc<Self> {
        thresholds.sort_unstable();
        Arc::new(Failures {
            thresholds,
            pace_every,
            ..Failures::default()
        })
    }

    /// Failures injected so far.
    pub fn injected(&self) -> usize {
        (self.state.load(Ordering::SeqCst) >> 32) as usize
    }

    /// Records seen so far, over all subtasks and attempts.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }
}

impl Injector for Failures {
    fn record(&self, attempt: u32) {
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
}

/// The identity that calls an [`Injector`] per record; an operator, to know its attempt.
struct Inject<T, I> {
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

impl<T: Data> DataStream<T> {
    /// This stream through an operator (chained) that calls `injector` per record, for
    /// example [`Failures`], to make the job fail where a test wants it to.
    pub fn inject_failures<I: Injector>(self, injector: &Arc<I>) -> DataStream<T> {
        let injector = injector.clone();
        self.transform::<T>("Inject Failures", move |ctx, next| {
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
}
