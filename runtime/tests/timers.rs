//! Keyed timers: event-time and processing-time timers fire once each, when due and in order, through failures, deletes and restores at another parallelism.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Failures, assert_resumed, inject, test_seed};
use weir_core::element::Watermark;
use weir_core::handle::OperatorStateMode;
use weir_core::keygroup::{assign_to_key_group, compute_key_group_range_for_operator_index};
use weir_runtime::keyed::{
    Collector, KeyedContext, KeyedProcessFunction, KeyedStateRegistry, TimeDomain,
};
use weir_runtime::operator::{Chained, OneInputOperator, OpResult, Output, SubtaskInfo};
use weir_runtime::sink::{Committer, FINAL_TRANSACTION, TwoPhaseCommitSink};
use weir_runtime::source::{SourceFunction, SourceStatus, splitmix64};
use weir_runtime::{
    DataStream, JobClient, JobStatus, RestartStrategy, StreamEnvironment, TaskError,
};
use weir_state::{HeapStateBackend, MemoryStoreStateBackend, StateBackend};
use weir_state::{OperatorListState, OperatorStateBackend, ValueState, ValueStateDescriptor};

// ---------------------------------------------------------------------------------------------
// Test data: records `(key, event time in ms)`, out of order within a bound.
// ---------------------------------------------------------------------------------------------

/// Keys of the event-time tests.
const KEYS: u64 = 31;
/// The watermark assigner's bound; the data is never more out of order than `JITTER_MS`.
const BOUND_MS: u64 = 60;
/// Record `i` is `3 i` ms minus up to this much.
const JITTER_MS: u64 = 50;
/// Timers are per key and bucket of event time, so several records share one timer.
const BUCKET_MS: i64 = 200;
/// How far after its bucket's end a timer is.
const DELAY_MS: i64 = 100;
/// Max parallelism of every job here (fixed, so restores at any parallelism agree).
const MAX_PARALLELISM: u32 = 128;

type Event = (u64, i64);
/// What `CountAtTimer` emits: key, timer timestamp, records of the key with a timestamp at or
/// before the timer, and the operator's watermark when the timer fired.
type Fired = (u64, i64, u64, i64);

fn key_of(i: u64) -> u64 {
    splitmix64(i ^ 0x7177) % KEYS
}

/// Event time of record `i`: increasing by 3 ms per record, minus a jitter below `JITTER_MS`.
fn ts_of(i: u64) -> i64 {
    (3 * i) as i64 - (splitmix64(i.wrapping_mul(7) ^ 0xabc) % JITTER_MS) as i64
}

fn event(i: u64) -> Event {
    (key_of(i), ts_of(i))
}

/// The timer a record at `ts` registers: after the end of its bucket.
fn timer_of(ts: i64) -> i64 {
    ts - ts.rem_euclid(BUCKET_MS) + BUCKET_MS + DELAY_MS
}

/// The firings of `CountAtTimer` over records `0..n`, computed without the engine: per key, one
/// per distinct timer, with the number of records of the key at or before it; sorted.
fn expected_firings(n: u64) -> Vec<(u64, i64, u64)> {
    let mut per_key: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for i in 0..n {
        let (k, ts) = event(i);
        per_key.entry(k).or_default().push(ts);
    }
    let mut out = Vec::new();
    for (k, mut stamps) in per_key {
        stamps.sort_unstable();
        let timers: BTreeSet<i64> = stamps.iter().map(|&ts| timer_of(ts)).collect();
        for t in timers {
            let count = stamps.partition_point(|&ts| ts <= t) as u64;
            out.push((k, t, count));
        }
    }
    out.sort_unstable();
    out
}

// ---------------------------------------------------------------------------------------------
// A source that keeps each subtask's records in index order.
// ---------------------------------------------------------------------------------------------

/// Subtask `j` of `p` emits records `j, j + p, j + 2p, …` in that order, so each subtask's
/// stream is as out of order as the data and no more (the built-in sources interleave splits).
/// Its position is operator state. Between batches it idles once (about 1 ms), so that a run
/// lasts long enough for checkpoints; with `pause_at` it emits no index from there on and idles
/// until stopped.
struct LaneSource {
    count: Option<u64>,
    make: fn(u64) -> Event,
    per_batch: usize,
    pause_at: Option<u64>,
    lanes: u64,
    next: u64,
    idle_turn: bool,
    state: Option<OperatorListState<u64>>,
}

impl LaneSource {
    fn new(count: Option<u64>, make: fn(u64) -> Event, per_batch: usize) -> Self {
        LaneSource {
            count,
            make,
            per_batch,
            pause_at: None,
            lanes: 1,
            next: 0,
            idle_turn: false,
            state: None,
        }
    }
}

impl SourceFunction<Event> for LaneSource {
    fn open(
        &mut self,
        info: &SubtaskInfo,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        let list = state.list_state::<u64>("lane-position", OperatorStateMode::SplitDistribute)?;
        let restored = state.get(&list)?;
        self.lanes = u64::from(info.parallelism);
        self.next = match (info.restored, restored.as_slice()) {
            (false, []) => u64::from(info.index),
            (true, [next]) => *next,
            (restored, got) => {
                return Err(TaskError::Operator {
                    operator: "LaneSource".into(),
                    message: format!("restored={restored} but lane positions {got:?}"),
                });
            }
        };
        self.state = Some(list);
        Ok(())
    }

    fn next_batch(&mut self, out: &mut Vec<Event>, max: usize) -> Result<SourceStatus, TaskError> {
        let end = self.count.unwrap_or(u64::MAX);
        if self.next >= end {
            return Ok(SourceStatus::End);
        }
        if std::mem::take(&mut self.idle_turn) {
            return Ok(SourceStatus::Idle);
        }
        let limit = self.pause_at.map_or(end, |p| p.min(end));
        while out.len() < max.min(self.per_batch) && self.next < limit {
            out.push((self.make)(self.next));
            self.next += self.lanes;
        }
        self.idle_turn = true;
        Ok(if out.is_empty() {
            SourceStatus::Idle
        } else {
            SourceStatus::More
        })
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        if let Some(list) = &self.state {
            state.update(list, &[self.next])?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Operators and functions under test.
// ---------------------------------------------------------------------------------------------

/// Per record, an event-time timer at `timer_of(ts)` (registered twice: one timer). A timer
/// emits how many records of its key at or before it the function has seen, and the watermark.
#[derive(Default)]
struct CountAtTimer {
    pending: Option<ValueState<Vec<i64>>>,
    counted: Option<ValueState<u64>>,
}

impl KeyedProcessFunction<u64, Event, Fired> for CountAtTimer {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, u64>) -> Result<(), TaskError> {
        self.pending = Some(states.value_state(&ValueStateDescriptor::new("pending"))?);
        self.counted = Some(states.value_state(&ValueStateDescriptor::new("counted"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (_, ts): Event,
        ctx: &mut KeyedContext<'_, u64>,
        _out: &mut Collector<'_, Fired>,
    ) -> Result<(), TaskError> {
        let pending = self.pending.unwrap();
        let mut stamps = ctx.value(pending).cloned().unwrap_or_default();
        stamps.push(ts);
        ctx.update(pending, stamps);
        ctx.register_event_time_timer(timer_of(ts));
        ctx.register_event_time_timer(timer_of(ts));
        Ok(())
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Fired>,
    ) -> Result<(), TaskError> {
        if domain != TimeDomain::EventTime {
            return Err(TaskError::Operator {
                operator: "CountAtTimer".into(),
                message: format!("a {domain:?} timer fired at {timestamp}"),
            });
        }
        let (pending, counted) = (self.pending.unwrap(), self.counted.unwrap());
        let mut stamps = ctx.value(pending).cloned().unwrap_or_default();
        let before = stamps.len();
        stamps.retain(|&ts| ts > timestamp);
        let count = ctx.value(counted).copied().unwrap_or(0) + (before - stamps.len()) as u64;
        ctx.update(counted, count);
        ctx.update(pending, stamps);
        out.collect((
            *ctx.current_key(),
            timestamp,
            count,
            ctx.current_watermark(),
        ))
    }
}

/// Behind the process function: counts records that arrive after a watermark at or past their
/// timer (a timer fired after the watermark went downstream), and the watermarks seen.
struct LateCheck {
    watermark: i64,
    late: Arc<AtomicU64>,
    watermarks: Arc<AtomicU64>,
}

impl OneInputOperator<Fired> for LateCheck {
    type Out = Fired;

    fn process(&mut self, record: Fired, out: &mut dyn Output<Fired>) -> OpResult {
        if record.1 <= self.watermark {
            self.late.fetch_add(1, Ordering::SeqCst);
        }
        out.push(record)
    }

    fn watermark(&mut self, watermark: Watermark, out: &mut dyn Output<Fired>) -> OpResult {
        self.watermark = self.watermark.max(watermark.0);
        if watermark.0 != i64::MAX {
            self.watermarks.fetch_add(1, Ordering::SeqCst);
        }
        out.watermark(watermark)
    }
}

#[derive(Clone, Default)]
struct Probes {
    late: Arc<AtomicU64>,
    watermarks: Arc<AtomicU64>,
}

/// Commits into a log shared across jobs: `(subtask, transaction, records)` per commit, in
/// commit order, nothing deduplicated.
#[derive(Default)]
struct CommitLog {
    commits: Mutex<Vec<(u32, u64, Vec<Fired>)>>,
}

impl Committer<Fired> for CommitLog {
    fn commit(&self, subtask: u32, transaction: u64, records: Vec<Fired>) -> Result<(), String> {
        if !records.is_empty() {
            self.commits
                .lock()
                .unwrap()
                .push((subtask, transaction, records));
        }
        Ok(())
    }
}

impl CommitLog {
    fn commits(&self) -> Vec<(u32, u64, Vec<Fired>)> {
        self.commits.lock().unwrap().clone()
    }
}

// ---------------------------------------------------------------------------------------------
// The event-time job.
// ---------------------------------------------------------------------------------------------

struct JobOptions<'a> {
    records: u64,
    /// Parallelism of the keyed process function and the sink; the source has 2.
    parallelism: u32,
    checkpoint_dir: &'a Path,
    checkpoint_interval: Option<Duration>,
    failures: Option<Arc<Failures>>,
    pause_at: Option<u64>,
    restore_from: Option<&'a Path>,
    savepoint_dir: Option<&'a Path>,
    state_backend: Arc<dyn StateBackend>,
}

impl<'a> JobOptions<'a> {
    fn new(records: u64, parallelism: u32, checkpoint_dir: &'a Path) -> Self {
        JobOptions {
            records,
            parallelism,
            checkpoint_dir,
            checkpoint_interval: None,
            failures: None,
            pause_at: None,
            restore_from: None,
            savepoint_dir: None,
            state_backend: Arc::new(HeapStateBackend),
        }
    }
}

/// lane source (2) → [inject] → timestamps/watermarks (bound 60 ms) → key_by → CountAtTimer →
/// LateCheck; the caller adds the sink.
fn timer_job(o: &JobOptions<'_>) -> (StreamEnvironment, DataStream<Fired>, Probes) {
    let env = StreamEnvironment::new();
    env.set_state_backend(o.state_backend.clone());
    env.set_job_name("timers-test")
        .set_max_parallelism(MAX_PARALLELISM)
        .set_checkpoint_dir(o.checkpoint_dir)
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 10,
            delay: Duration::from_millis(5),
        });
    if let Some(i) = o.checkpoint_interval {
        env.enable_checkpointing(i);
    }
    if let Some(from) = o.restore_from {
        env.restore_from(from);
    }
    if let Some(dir) = o.savepoint_dir {
        env.set_savepoint_dir(dir);
    }
    env.set_parallelism(2);
    let (records, pause_at) = (o.records, o.pause_at);
    let mut events = env
        .add_source("Lanes", move |_| {
            let mut s = LaneSource::new(Some(records), event, 64);
            s.pause_at = pause_at;
            Box::new(s) as Box<dyn SourceFunction<Event>>
        })
        .uid("lanes");
    if let Some(failures) = &o.failures {
        events = inject(events, failures);
    }
    let events =
        events.assign_timestamps_and_watermarks(Duration::from_millis(BOUND_MS), |e: &Event| e.1);
    env.set_parallelism(o.parallelism);
    let probes = Probes::default();
    let p = probes.clone();
    let fired = events
        .key_by(|e: &Event| &e.0)
        .process("CountAtTimer", CountAtTimer::default)
        .uid("count-at-timer")
        .transform::<Fired>("LateCheck", move |_, next| {
            Box::new(Chained::new(
                LateCheck {
                    watermark: i64::MIN,
                    late: p.late.clone(),
                    watermarks: p.watermarks.clone(),
                },
                next,
            ))
        });
    (env, fired, probes)
}

/// The exactly-once sink into `log`.
fn log_sink(stream: DataStream<Fired>, log: &Arc<CommitLog>) {
    let log = log.clone();
    stream
        .transform::<()>("Log Sink", move |ctx, next| {
            Box::new(Chained::new(
                TwoPhaseCommitSink::new(ctx.operator_id, &ctx.info, log.clone()),
                next,
            ))
        })
        .uid("log-sink");
}

/// The checks of one run's (or one part of a run's) output, per subtask in commit order: each
/// timer fired at or after the watermark reached it; in each subtask in timestamp order; a key's
/// timers in one subtask (the one owning its key group, at `parallelism`).
fn check_subtask_order(by_subtask: &BTreeMap<u32, Vec<Fired>>, parallelism: u32, ctx: &str) {
    let mut owner: BTreeMap<u64, u32> = BTreeMap::new();
    for (subtask, records) in by_subtask {
        let range =
            compute_key_group_range_for_operator_index(MAX_PARALLELISM, parallelism, *subtask);
        let mut last = i64::MIN;
        for &(key, t, _, wm) in records {
            assert!(wm >= t, "{ctx}: timer ({key}, {t}) fired at watermark {wm}");
            assert!(t >= last, "{ctx}: subtask {subtask} fired {t} after {last}");
            last = t;
            let o = *owner.entry(key).or_insert(*subtask);
            assert_eq!(
                o, *subtask,
                "{ctx}: key {key} in subtasks {o} and {subtask}"
            );
            let kg = assign_to_key_group(&key, MAX_PARALLELISM);
            assert!(
                range.contains(kg),
                "{ctx}: key {key} (key group {kg}) fired in subtask {subtask} of {parallelism}, \
                 which owns {range}"
            );
        }
    }
}

/// Per key, the timers in firing order are strictly increasing (each fires once, in order);
/// and the firings are exactly the expected ones.
fn check_firings(ordered: &[Fired], expected: &[(u64, i64, u64)], ctx: &str) {
    let mut last: BTreeMap<u64, i64> = BTreeMap::new();
    for &(key, t, _, _) in ordered {
        if let Some(&prev) = last.get(&key) {
            assert!(
                t > prev,
                "{ctx}: key {key} fired {t} after {prev} (a duplicate or out of order)"
            );
        }
        last.insert(key, t);
    }
    let mut got: Vec<(u64, i64, u64)> = ordered.iter().map(|&(k, t, c, _)| (k, t, c)).collect();
    got.sort_unstable();
    if got != expected {
        let g: BTreeSet<_> = got.iter().collect();
        let e: BTreeSet<_> = expected.iter().collect();
        let missing: Vec<_> = e.difference(&g).take(5).collect();
        let extra: Vec<_> = g.difference(&e).take(5).collect();
        panic!(
            "{ctx}: {} firings, expected {}; missing (first 5) {missing:?}, unexpected {extra:?}",
            got.len(),
            expected.len()
        );
    }
}

fn by_subtask(commits: &[(u32, u64, Vec<Fired>)]) -> BTreeMap<u32, Vec<Fired>> {
    let mut sorted: Vec<&(u32, u64, Vec<Fired>)> = commits.iter().collect();
    sorted.sort_by_key(|(s, txn, _)| (*s, *txn));
    let mut out: BTreeMap<u32, Vec<Fired>> = BTreeMap::new();
    for (s, _, records) in sorted {
        out.entry(*s).or_default().extend(records.iter().copied());
    }
    out
}

const RECORDS: u64 = 20_000;

// ---------------------------------------------------------------------------------------------
// 1. Event-time timers fire in order, once, after the watermark.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_time_timers_fire_once_in_order_after_the_watermark() {
    let tmp = tempfile::tempdir().unwrap();
    let (env, fired, probes) = timer_job(&JobOptions::new(RECORDS, 3, tmp.path()));
    let handle = fired.collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.status, JobStatus::Finished);
    let expected = expected_firings(RECORDS);
    assert!(expected.len() > 5_000, "{} timers", expected.len());
    let by_subtask = handle.records_by_subtask();
    check_subtask_order(&by_subtask, 3, "failure-free run");
    let all: Vec<Fired> = by_subtask.into_values().flatten().collect();
    check_firings(&all, &expected, "failure-free run");
    assert_eq!(
        probes.late.load(Ordering::SeqCst),
        0,
        "timers fired after their watermark was forwarded"
    );
    // Timers fired as the watermark advanced, not only at the end of input (Watermark::MAX).
    let during = all.iter().filter(|f| f.3 != i64::MAX).count();
    assert!(
        during > all.len() / 2,
        "only {during} of {} timers fired before the end of event time",
        all.len()
    );
    assert!(probes.watermarks.load(Ordering::SeqCst) > 10);
}

// ---------------------------------------------------------------------------------------------
// 2. Timers survive failures.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_time_timers_are_exactly_once_under_failures() {
    timers_exactly_once_under_failures(Arc::new(HeapStateBackend)).await;
}

/// The same with timers in a store of bytes: they are found again by scanning it at restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_time_timers_are_exactly_once_under_failures_on_a_store_backend() {
    timers_exactly_once_under_failures(Arc::new(MemoryStoreStateBackend)).await;
}

async fn timers_exactly_once_under_failures(backend: Arc<dyn StateBackend>) {
    let seed = test_seed();
    let expected = expected_firings(RECORDS);
    let tmp = tempfile::tempdir().unwrap();

    let (env, fired, _) = timer_job(&JobOptions::new(RECORDS, 2, &tmp.path().join("clean")));
    let clean = fired.collect();
    env.execute().bounded().await.unwrap();
    let clean_all: Vec<Fired> = clean.records();
    check_firings(&clean_all, &expected, "failure-free run");

    for round in 0..3u64 {
        let mut rng = seed.wrapping_add(round);
        let mut next = || {
            rng = splitmix64(rng);
            rng
        };
        // One failure in each third of the records (counted over attempts).
        let thresholds: Vec<u64> = (0..3)
            .map(|k| k * RECORDS / 3 + RECORDS / 12 + next() % (RECORDS / 6))
            .collect();
        let interval = Duration::from_millis(5 + next() % 11);
        let ctx =
            format!("seed={seed} round={round} thresholds={thresholds:?} interval={interval:?}");
        let failures = Failures::at(thresholds);
        let dir = tmp.path().join(format!("faulty-{round}"));
        let mut o = JobOptions::new(RECORDS, 2, &dir);
        o.checkpoint_interval = Some(interval);
        o.failures = Some(failures.clone());
        o.state_backend = backend.clone();
        let (env, fired, probes) = timer_job(&o);
        let faulty = fired.collect();
        let r = env
            .execute()
            .bounded()
            .await
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let ctx = format!("{ctx} checkpoints={}", r.checkpoints_completed);
        assert_eq!(r.status, JobStatus::Finished, "{ctx}");
        assert_eq!(r.restarts, 3, "{ctx}");
        assert_resumed(&r, RECORDS, &ctx);
        assert_eq!(failures.injected(), 3, "{ctx}");
        let by_subtask = faulty.records_by_subtask();
        check_subtask_order(&by_subtask, 2, &ctx);
        let all: Vec<Fired> = by_subtask.into_values().flatten().collect();
        check_firings(&all, &expected, &ctx);
        let project = |v: &[Fired]| {
            let mut p: Vec<(u64, i64, u64)> = v.iter().map(|&(k, t, c, _)| (k, t, c)).collect();
            p.sort_unstable();
            p
        };
        assert!(
            project(&all) == project(&clean_all),
            "{ctx}: differs from the failure-free run"
        );
        assert_eq!(probes.late.load(Ordering::SeqCst), 0, "{ctx}");
        if r.checkpoints_completed > 0 {
            eprintln!("{ctx}: ok");
            return;
        }
        eprintln!("{ctx}: no checkpoint completed; again");
    }
    panic!("seed={seed}: no run completed a checkpoint");
}

// ---------------------------------------------------------------------------------------------
// 3. Deleted timers do not fire; a timer registered twice fires once.
// ---------------------------------------------------------------------------------------------

/// A multiple of the source's 2 lanes: each key's records come from one lane, in order.
const DELETE_KEYS: u64 = 4;
const DELETE_RECORDS: u64 = 2_000;

/// Record `i`: key `i % 4`, event time `10 i`.
fn spaced_event(i: u64) -> Event {
    (i % DELETE_KEYS, 10 * i as i64)
}

/// Per record at `ts` (offsets below 10, so records never share a timer):
/// - `ts + 1` registered twice; when it fires it deletes `ts + 5`;
/// - `ts + 2` registered, then deleted;
/// - `ts + 3` registered; the key's next record deletes it (so only the last one fires);
/// - `ts + 4` registered, deleted and registered again; when it fires it registers `ts + 6`;
/// - `ts + 5` registered (deleted by `ts + 1`);
/// - `ts + 7` deleted, never registered.
#[derive(Default)]
struct DeleteAndDup {
    last: Option<ValueState<i64>>,
}

impl KeyedProcessFunction<u64, Event, Fired> for DeleteAndDup {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, u64>) -> Result<(), TaskError> {
        self.last = Some(states.value_state(&ValueStateDescriptor::new("last"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (_, ts): Event,
        ctx: &mut KeyedContext<'_, u64>,
        _out: &mut Collector<'_, Fired>,
    ) -> Result<(), TaskError> {
        let last = self.last.unwrap();
        if let Some(&prev) = ctx.value(last) {
            ctx.delete_event_time_timer(prev + 3);
        }
        ctx.update(last, ts);
        ctx.register_event_time_timer(ts + 1);
        ctx.register_event_time_timer(ts + 1);
        ctx.register_event_time_timer(ts + 2);
        ctx.delete_event_time_timer(ts + 2);
        ctx.register_event_time_timer(ts + 3);
        ctx.register_event_time_timer(ts + 4);
        ctx.delete_event_time_timer(ts + 4);
        ctx.register_event_time_timer(ts + 4);
        ctx.register_event_time_timer(ts + 5);
        ctx.delete_event_time_timer(ts + 7);
        Ok(())
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Fired>,
    ) -> Result<(), TaskError> {
        let base = timestamp - timestamp.rem_euclid(10);
        match timestamp - base {
            1 => ctx.delete_event_time_timer(base + 5),
            4 => ctx.register_event_time_timer(base + 6),
            _ => {}
        }
        let tag = if domain == TimeDomain::EventTime {
            0
        } else {
            1
        };
        out.collect((*ctx.current_key(), timestamp, tag, ctx.current_watermark()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_timers_do_not_fire_and_a_timer_registered_twice_fires_once() {
    let tmp = tempfile::tempdir().unwrap();
    let env = StreamEnvironment::new();
    env.set_job_name("timer-deletes")
        .set_max_parallelism(MAX_PARALLELISM)
        .set_checkpoint_dir(tmp.path())
        .set_parallelism(2);
    let handle = env
        .add_source("Lanes", |_| {
            Box::new(LaneSource::new(Some(DELETE_RECORDS), spaced_event, 64))
                as Box<dyn SourceFunction<Event>>
        })
        .assign_timestamps_and_watermarks(Duration::from_millis(100), |e: &Event| e.1)
        .key_by(|e: &Event| &e.0)
        .process("DeleteAndDup", DeleteAndDup::default)
        .collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.status, JobStatus::Finished);

    let mut expected: Vec<(u64, i64, u64)> = Vec::new();
    for i in 0..DELETE_RECORDS {
        let (k, ts) = spaced_event(i);
        expected.extend([(k, ts + 1, 0), (k, ts + 4, 0), (k, ts + 6, 0)]);
        if i + DELETE_KEYS >= DELETE_RECORDS {
            expected.push((k, ts + 3, 0));
        }
    }
    expected.sort_unstable();
    let by_subtask = handle.records_by_subtask();
    check_subtask_order(&by_subtask, 2, "deletes");
    let all: Vec<Fired> = by_subtask.into_values().flatten().collect();
    check_firings(&all, &expected, "deletes");
}

// ---------------------------------------------------------------------------------------------
// 4. Processing-time timers fire on the wall clock.
// ---------------------------------------------------------------------------------------------

const PT_KEYS: u64 = 4;
/// Each key's chain of processing-time timers: this many, each 20 ms after the last fired.
const PT_CHAIN: u32 = 3;

/// A registration or a firing of a processing-time timer.
#[derive(Clone, Copy, Debug)]
enum PtEvent {
    /// `(key, timer)`: registered and deleted right away.
    Deleted(u64, i64),
    /// `(key, timer, wall clock in on_timer, domain)`.
    Fired(u64, i64, i64, TimeDomain),
    /// `(key, timer)`: the timer registered after the chain's last, which fires after every
    /// timer of the key registered before it (a deleted one, or one fired twice, included).
    Sentinel(u64, i64),
}

/// On a key's first record: a processing-time timer 20 ms ahead, and one 30 ms ahead that is
/// deleted at once. Each firing registers the next, 20 ms ahead, until `PT_CHAIN` fired; the
/// last registers a sentinel, 20 ms ahead.
struct PtChain {
    log: Arc<Mutex<Vec<PtEvent>>>,
    fired: Option<ValueState<u32>>,
}

impl KeyedProcessFunction<u64, Event, Fired> for PtChain {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, u64>) -> Result<(), TaskError> {
        self.fired = Some(states.value_state(&ValueStateDescriptor::new("fired"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        _record: Event,
        ctx: &mut KeyedContext<'_, u64>,
        _out: &mut Collector<'_, Fired>,
    ) -> Result<(), TaskError> {
        let fired = self.fired.unwrap();
        if ctx.value(fired).is_none() {
            ctx.update(fired, 0);
            let now = ctx.current_processing_time();
            ctx.register_processing_time_timer(now + 20);
            ctx.register_processing_time_timer(now + 30);
            ctx.delete_processing_time_timer(now + 30);
            self.log
                .lock()
                .unwrap()
                .push(PtEvent::Deleted(*ctx.current_key(), now + 30));
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, u64>,
        _out: &mut Collector<'_, Fired>,
    ) -> Result<(), TaskError> {
        let now = ctx.current_processing_time();
        let key = *ctx.current_key();
        let fired = self.fired.unwrap();
        let n = ctx.value(fired).copied().unwrap_or(0) + 1;
        ctx.update(fired, n);
        let event = if n > PT_CHAIN {
            PtEvent::Sentinel(key, timestamp)
        } else {
            PtEvent::Fired(key, timestamp, now, domain)
        };
        self.log.lock().unwrap().push(event);
        if n <= PT_CHAIN {
            ctx.register_processing_time_timer(now + 20);
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processing_time_timers_fire_when_the_wall_clock_reaches_them() {
    let tmp = tempfile::tempdir().unwrap();
    let log: Arc<Mutex<Vec<PtEvent>>> = Arc::default();
    let env = StreamEnvironment::new();
    env.set_job_name("processing-time-timers")
        .set_checkpoint_dir(tmp.path())
        .set_parallelism(2);
    let l = log.clone();
    env.add_source("Lanes", |_| {
        // Unbounded, 8 records per millisecond or so.
        Box::new(LaneSource::new(None, |i| (i % PT_KEYS, i as i64), 8))
            as Box<dyn SourceFunction<Event>>
    })
    .key_by(|e: &Event| &e.0)
    .process("PtChain", move || PtChain {
        log: l.clone(),
        fired: None,
    })
    .collect();
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    let fired_per_key = |log: &[PtEvent]| {
        let mut m: BTreeMap<u64, Vec<(i64, i64, TimeDomain)>> = BTreeMap::new();
        for e in log {
            if let PtEvent::Fired(k, ts, now, d) = *e {
                m.entry(k).or_default().push((ts, now, d));
            }
        }
        m
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = {
            let log = log.lock().unwrap();
            let sentinels = log
                .iter()
                .filter(|e| matches!(e, PtEvent::Sentinel(..)))
                .count();
            sentinels as u64 >= PT_KEYS
        };
        if done {
            break;
        }
        assert!(
            !job.is_finished(),
            "the job ended: {:?}",
            job.await.unwrap()
        );
        assert!(
            Instant::now() < deadline,
            "timers did not all fire within a minute: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every key's sentinel fired: a deleted timer (or one fired twice), being earlier, would
    // have fired before it.
    client.cancel();
    let r = job.await.unwrap().unwrap();
    assert_eq!(r.status, JobStatus::Canceled);

    let log = log.lock().unwrap().clone();
    let deleted: BTreeSet<(u64, i64)> = log
        .iter()
        .filter_map(|e| match *e {
            PtEvent::Deleted(k, ts) => Some((k, ts)),
            PtEvent::Fired(..) | PtEvent::Sentinel(..) => None,
        })
        .collect();
    let sentinels: BTreeMap<u64, i64> = log
        .iter()
        .filter_map(|e| match *e {
            PtEvent::Sentinel(k, ts) => Some((k, ts)),
            _ => None,
        })
        .collect();
    let m = fired_per_key(&log);
    assert_eq!(m.len() as u64, PT_KEYS, "{log:?}");
    for (key, firings) in &m {
        let sentinel = sentinels[key];
        assert!(
            firings.iter().all(|(ts, _, _)| *ts < sentinel),
            "key {key}: a timer fired after the sentinel {sentinel}: {firings:?}"
        );
        assert_eq!(
            firings.len(),
            PT_CHAIN as usize,
            "key {key}: {firings:?} (a deleted timer fired, or one fired twice)"
        );
        let mut last = i64::MIN;
        for &(ts, now, domain) in firings {
            assert_eq!(domain, TimeDomain::ProcessingTime, "key {key}: {firings:?}");
            // A timer fires once the clock is past its millisecond (FLINK-9857), so that a
            // record processed in that millisecond comes before it.
            assert!(
                now > ts,
                "key {key}: timer {ts} fired at {now}, before the clock passed it"
            );
            assert!(ts > last, "key {key}: {firings:?}");
            last = ts;
            assert!(
                !deleted.contains(&(*key, ts)),
                "key {key}: deleted timer {ts} fired"
            );
        }
    }
    assert_eq!(deleted.len() as u64, PT_KEYS, "{log:?}");
}

// ---------------------------------------------------------------------------------------------
// 5. Timers survive a restore at another parallelism.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_time_timers_survive_a_savepoint_restore_at_another_parallelism() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = expected_firings(RECORDS);
    let pause = RECORDS / 2;

    // Parallelism 2 until the sources have emitted every record below `pause`, then stop with a
    // savepoint: the timers up to the watermark have fired, the later ones are in the savepoint.
    let first_log = Arc::new(CommitLog::default());
    let sp_root = tmp.path().join("savepoints");
    let first_dir = tmp.path().join("cp-first");
    let mut o = JobOptions::new(RECORDS, 2, &first_dir);
    o.checkpoint_interval = Some(Duration::from_millis(20));
    o.pause_at = Some(pause);
    o.savepoint_dir = Some(&sp_root);
    let (env, fired, probes) = timer_job(&o);
    log_sink(fired, &first_log);
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.source_records() < pause {
        assert!(
            !job.is_finished(),
            "the first job ended: {:?}",
            job.await.unwrap()
        );
        assert!(
            Instant::now() < deadline,
            "the sources did not reach the pause"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(client.source_records(), pause);
    let savepoint = loop {
        match client.stop_with_savepoint(None, false).await {
            Ok(path) => break path,
            Err(e) if e.to_string().contains("not triggered") => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("stop with savepoint: {e}"),
        }
    };
    let r = job.await.unwrap().unwrap();
    assert_eq!(r.status, JobStatus::Finished);
    assert_eq!(r.source_records, pause);
    assert_eq!(probes.late.load(Ordering::SeqCst), 0);
    let savepoint = PathBuf::from(savepoint.strip_prefix("file://").unwrap_or(&savepoint));
    assert!(savepoint.join("_metadata").is_file(), "{savepoint:?}");
    let first = first_log.commits();
    check_subtask_order(&by_subtask(&first), 2, "before the savepoint");
    let savepoint_txn = first
        .iter()
        .map(|c| c.1)
        .filter(|t| *t != FINAL_TRANSACTION)
        .max()
        .expect("nothing fired before the savepoint");
    assert!(
        first.iter().all(|c| c.1 != FINAL_TRANSACTION),
        "records after the savepoint"
    );
    let fired_before: usize = first.iter().map(|c| c.2.len()).sum();
    eprintln!(
        "{fired_before} of {} timers fired before savepoint {savepoint:?} (transaction \
         {savepoint_txn})",
        expected.len()
    );
    assert!(
        fired_before > 0 && fired_before < expected.len(),
        "{fired_before} of {} timers fired before the savepoint",
        expected.len()
    );

    for parallelism in [3, 1] {
        let ctx = format!("restored at parallelism {parallelism}");
        let log = Arc::new(CommitLog::default());
        let dir = tmp.path().join(format!("cp-{parallelism}"));
        let mut o = JobOptions::new(RECORDS, parallelism, &dir);
        o.checkpoint_interval = Some(Duration::from_millis(20));
        o.restore_from = Some(&savepoint);
        let (env, fired, probes) = timer_job(&o);
        log_sink(fired, &log);
        let r = env
            .execute()
            .bounded()
            .await
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(r.status, JobStatus::Finished, "{ctx}");
        assert_eq!(r.restarts, 0, "{ctx}");
        assert_eq!(r.source_records, RECORDS - pause, "{ctx}");
        assert_eq!(probes.late.load(Ordering::SeqCst), 0, "{ctx}");
        // The sink commits again what the savepoint had pre-committed (its transactions up to
        // the savepoint's): the same batches the first job committed. The rest is new.
        let (again, new): (Vec<_>, Vec<_>) = log
            .commits()
            .into_iter()
            .partition(|c| c.1 <= savepoint_txn);
        for (s, txn, records) in &again {
            assert!(
                first.iter().any(|(_, t, r)| t == txn && r == records),
                "{ctx}: subtask {s} committed transaction {txn} again with records the first \
                 job did not commit in it"
            );
        }
        eprintln!(
            "{ctx}: {} batches committed again, {} new firings",
            again.len(),
            new.iter().map(|c| c.2.len()).sum::<usize>()
        );
        check_subtask_order(&by_subtask(&new), parallelism, &ctx);
        let mut all: Vec<Fired> = by_subtask(&first).into_values().flatten().collect();
        all.extend(by_subtask(&new).into_values().flatten());
        // `check_firings` wants each key's firings in order: the first job's, then the second's.
        let mut ordered: Vec<Fired> = Vec::new();
        let keys: BTreeSet<u64> = all.iter().map(|f| f.0).collect();
        for k in keys {
            ordered.extend(
                by_subtask(&first)
                    .values()
                    .flatten()
                    .chain(by_subtask(&new).values().flatten())
                    .filter(|f| f.0 == k)
                    .copied(),
            );
        }
        check_firings(&ordered, &expected, &ctx);
    }
}
