//! Windows over keyed streams: tumbling, sliding and session windows in event time with reduce,
//! aggregate and process functions give what a plain computation over the same records gives,
//! at parallelism 1 and 2, under injected failures and on a store backend; allowed lateness
//! fires a window again, late records reach the side output, count windows fire every n
//! records, and bad window settings fail the job at build time naming the problem.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::{Failures, inject};
use weir_runtime::keyed::Collector;
use weir_runtime::source::splitmix64;
use weir_runtime::state::AggregateFunction;
use weir_runtime::window::{
    EventTimeSessionWindows, SlidingEventTimeWindows, TimeWindow, TumblingEventTimeWindows,
    WindowInfo,
};
use weir_runtime::{JobError, RestartStrategy, StreamEnvironment, TaskError};
use weir_state::{MemoryStoreStateBackend, StateBackend};

/// Keys of the event-time tests.
const KEYS: u64 = 13;
/// The watermark assigner's bound: the data is never more out of order than `JITTER_MS`.
const BOUND_MS: u64 = 60;
const JITTER_MS: u64 = 50;
const RECORDS: u64 = 20_000;

/// `(key, event time in ms, value)`.
type Event = (u64, i64, i64);

/// Record `i`: its key, an event time of `2 i` ms minus an even jitter below `JITTER_MS` (all
/// timestamps even, so an odd session gap never makes two sessions touch), and a value.
fn event(i: u64) -> Event {
    let key = splitmix64(i ^ 0x51) % KEYS;
    let jitter = (splitmix64(i.wrapping_mul(3) ^ 0x77) % (JITTER_MS / 2)) * 2;
    let ts = (2 * i) as i64 - jitter as i64;
    let value = (splitmix64(i ^ 0x99) % 100) as i64;
    (key, ts, value)
}

fn env(parallelism: u32, failures: &[u64]) -> (StreamEnvironment, Arc<Failures>) {
    let env = StreamEnvironment::new();
    env.set_parallelism(parallelism)
        .set_max_parallelism(128)
        .enable_checkpointing(Duration::from_millis(10))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 5,
            delay: Duration::ZERO,
        });
    env.config_mut().batch_size = 64;
    let dir = tempfile::tempdir().unwrap().keep();
    env.set_checkpoint_dir(dir);
    (env, Failures::paced(failures.to_vec(), 500))
}

/// The events with timestamps and bounded-out-of-orderness watermarks, failures injected. The
/// collection source gives each reader one split (every `parallelism`-th record, in order), so
/// the records a subtask emits are out of order by at most the jitter.
fn events(env: &StreamEnvironment, failures: &Arc<Failures>) -> weir_runtime::DataStream<Event> {
    let events = env
        .from_collection((0..RECORDS).map(event).collect())
        .uid("events")
        .assign_timestamps_and_watermarks(Duration::from_millis(BOUND_MS), |e: &Event| e.1)
        .uid("watermarks");
    inject(events, failures)
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

// ---------------------------------------------------------------------------------------------
// Tumbling windows with reduce.
// ---------------------------------------------------------------------------------------------

const TUMBLE_MS: i64 = 100;

/// `(key, window start, sum of values)` per non-empty window, computed without the engine.
fn expected_tumbling() -> Vec<(u64, i64, i64)> {
    let mut sums: BTreeMap<(u64, i64), i64> = BTreeMap::new();
    for i in 0..RECORDS {
        let (k, ts, v) = event(i);
        *sums.entry((k, ts - ts.rem_euclid(TUMBLE_MS))).or_default() += v;
    }
    sums.into_iter().map(|((k, s), v)| (k, s, v)).collect()
}

async fn tumbling(parallelism: u32, failures: &[u64], backend: Option<Arc<dyn StateBackend>>) {
    let (env, injected) = env(parallelism, failures);
    if let Some(b) = backend {
        env.set_state_backend(b);
    }
    let out = events(&env, &injected)
        .key_by(|e: &Event| &e.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(
            TUMBLE_MS as u64,
        )))
        .timestamps(|e: &Event| e.1)
        .reduce_with(
            |a: &Event, b: &Event| (a.0, a.1.max(b.1), a.2 + b.2),
            |key: &u64, w: &TimeWindow, sum: Event| (*key, w.start, sum.2),
        )
        .uid("tumbling")
        .collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(injected.injected(), failures.len());
    assert_eq!(r.restarts as usize, failures.len());
    assert_eq!(sorted(out.records()), expected_tumbling());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbling_event_time_windows_reduce_exactly_at_parallelism_1() {
    tumbling(1, &[], None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbling_event_time_windows_reduce_exactly_once_under_failures_at_parallelism_2() {
    tumbling(2, &[4_000, 13_000], None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbling_windows_on_a_store_backend_are_exactly_once_under_failures() {
    let backend: Arc<dyn StateBackend> = Arc::new(MemoryStoreStateBackend);
    tumbling(2, &[7_000], Some(backend)).await;
}

// ---------------------------------------------------------------------------------------------
// Sliding windows with aggregate.
// ---------------------------------------------------------------------------------------------

const SLIDE_SIZE_MS: i64 = 300;
const SLIDE_MS: i64 = 100;

/// Count and sum of values: an average.
struct Average;

impl AggregateFunction<Event, (u64, i64), (u64, i64)> for Average {
    fn create_accumulator(&self) -> (u64, i64) {
        (0, 0)
    }
    fn add(&self, e: Event, acc: &mut (u64, i64)) {
        acc.0 += 1;
        acc.1 += e.2;
    }
    fn get_result(&self, acc: &(u64, i64)) -> (u64, i64) {
        *acc
    }
    fn merge(&self, a: (u64, i64), b: (u64, i64)) -> (u64, i64) {
        (a.0 + b.0, a.1 + b.1)
    }
}

/// `(key, window start, count, sum)` per non-empty sliding window, computed without the engine.
fn expected_sliding() -> Vec<(u64, i64, u64, i64)> {
    let mut acc: BTreeMap<(u64, i64), (u64, i64)> = BTreeMap::new();
    for i in 0..RECORDS {
        let (k, ts, v) = event(i);
        // Windows start at multiples of the slide; the record is in those starting in
        // (ts - size, ts].
        let last = ts - ts.rem_euclid(SLIDE_MS);
        let mut start = last;
        while start > ts - SLIDE_SIZE_MS {
            let a = acc.entry((k, start)).or_default();
            a.0 += 1;
            a.1 += v;
            start -= SLIDE_MS;
        }
    }
    acc.into_iter()
        .map(|((k, s), (n, v))| (k, s, n, v))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_event_time_windows_aggregate_exactly_once_under_failures() {
    let failures = [9_000];
    let (env, injected) = env(2, &failures);
    let out = events(&env, &injected)
        .key_by(|e: &Event| &e.0)
        .window(SlidingEventTimeWindows::of(
            Duration::from_millis(SLIDE_SIZE_MS as u64),
            Duration::from_millis(SLIDE_MS as u64),
        ))
        .timestamps(|e: &Event| e.1)
        .aggregate_with(Average, |key: &u64, w: &TimeWindow, (n, sum)| {
            assert_eq!(w.end - w.start, SLIDE_SIZE_MS);
            (*key, w.start, n, sum)
        })
        .uid("sliding")
        .collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.restarts, 1);
    assert_eq!(sorted(out.records()), expected_sliding());
}

// ---------------------------------------------------------------------------------------------
// Session windows with a process function.
// ---------------------------------------------------------------------------------------------

/// Odd, so two sessions of even timestamps never touch.
const GAP_MS: i64 = 41;

/// `(key, session start, session end, records, sum)`, computed without the engine: per key, the
/// sorted timestamps split where the next one is past the current session's end.
fn expected_sessions() -> Vec<(u64, i64, i64, usize, i64)> {
    let mut per_key: BTreeMap<u64, Vec<(i64, i64)>> = BTreeMap::new();
    for i in 0..RECORDS {
        let (k, ts, v) = event(i);
        per_key.entry(k).or_default().push((ts, v));
    }
    let mut out = Vec::new();
    for (k, mut records) in per_key {
        records.sort_unstable();
        let mut current: Option<(i64, i64, usize, i64)> = None;
        for (ts, v) in records {
            current = match current {
                Some((s, e, n, sum)) if ts <= e => Some((s, e.max(ts + GAP_MS), n + 1, sum + v)),
                Some((s, e, n, sum)) => {
                    out.push((k, s, e, n, sum));
                    Some((ts, ts + GAP_MS, 1, v))
                }
                None => Some((ts, ts + GAP_MS, 1, v)),
            };
        }
        if let Some((s, e, n, sum)) = current {
            out.push((k, s, e, n, sum));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_windows_merge_and_process_every_record_exactly_once_under_failures() {
    sessions(2, &[6_000]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_windows_merge_and_process_every_record_at_parallelism_1() {
    sessions(1, &[]).await;
}

async fn sessions(parallelism: u32, failures: &[u64]) {
    let (env, injected) = env(parallelism, failures);
    let out = events(&env, &injected)
        .key_by(|e: &Event| &e.0)
        .window(EventTimeSessionWindows::with_gap(Duration::from_millis(
            GAP_MS as u64,
        )))
        .timestamps(|e: &Event| e.1)
        .process(|| {
            |key: &u64,
             w: &WindowInfo,
             records: &[Event],
             out: &mut Collector<'_, (u64, i64, i64, usize, i64)>|
             -> Result<(), TaskError> {
                let sum = records.iter().map(|e| e.2).sum();
                out.collect((*key, w.window.start, w.window.end, records.len(), sum))
            }
        })
        .uid("sessions")
        .collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.restarts as usize, failures.len());
    let got = sorted(out.records());
    let want = expected_sessions();
    assert!(
        want.len() > 100,
        "the data should make many sessions: {}",
        want.len()
    );
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w, "the first difference");
    }
    assert_eq!(got.len(), want.len());
}

// ---------------------------------------------------------------------------------------------
// Lateness, the late side output, count windows.
// ---------------------------------------------------------------------------------------------

/// One record per batch, so that a watermark follows each record.
fn one_by_one(
    records: Vec<(u64, i64)>,
) -> (StreamEnvironment, weir_runtime::DataStream<(u64, i64)>) {
    let env = StreamEnvironment::new();
    env.set_parallelism(1);
    env.config_mut().batch_size = 1;
    let s = env
        .from_collection(records)
        .assign_timestamps_and_watermarks(Duration::ZERO, |r: &(u64, i64)| r.1);
    (env, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_lateness_fires_again_and_later_records_go_to_the_side_output() {
    // Windows of 10 ms, 5 ms of lateness, watermark = the largest timestamp so far - 1.
    let records = vec![
        (1, 1),
        (1, 5),
        (1, 12), // watermark 11: [0, 10) fires with 1 + 5
        (1, 3),  // late, within the lateness: [0, 10) fires again with 1 + 5 + 3
        (1, 20), // watermark 19: [10, 20) fires; [0, 10) is cleaned up (at 9 + 5)
        (1, 4),  // too late: the side output
        (1, 25),
    ];
    let (env, s) = one_by_one(records);
    let (results, late) = s
        .key_by(|r: &(u64, i64)| &r.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(10)))
        .timestamps(|r: &(u64, i64)| r.1)
        .allowed_lateness(Duration::from_millis(5))
        .side_output_late_data()
        .uid("late-windows")
        .reduce_with(
            |a: &(u64, i64), b: &(u64, i64)| (a.0, a.1 + b.1),
            |_: &u64, w: &TimeWindow, r: (u64, i64)| (w.start, r.1),
        );
    let results = results.collect();
    let late = late.collect();
    env.execute().bounded().await.unwrap();
    assert_eq!(
        results.records(),
        vec![(0, 6), (0, 9), (10, 12), (20, 45)],
        "in firing order"
    );
    assert_eq!(late.records(), vec![(1, 4)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timestamp_far_in_the_future_advances_the_watermark_as_the_strategy_says() {
    // Bounded out-of-orderness trusts the largest timestamp: after one from the far future,
    // every record of the present is late, and goes to the side output (none is lost).
    let records = vec![(1, 1), (1, 2), (1, i64::MAX / 2), (1, 3), (1, 4)];
    let (env, s) = one_by_one(records);
    let (results, late) = s
        .key_by(|r: &(u64, i64)| &r.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(10)))
        .timestamps(|r: &(u64, i64)| r.1)
        .side_output_late_data()
        .reduce(|a: &(u64, i64), b: &(u64, i64)| (a.0, a.1 + b.1));
    let results = results.collect();
    let late = late.collect();
    env.execute().bounded().await.unwrap();
    assert_eq!(results.records(), vec![(1, 3), (1, i64::MAX / 2)]);
    assert_eq!(late.records(), vec![(1, 3), (1, 4)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_windows_fire_every_n_records_per_key() {
    let records: Vec<(u64, i64)> = (0..23).map(|i| (i % 2, i as i64)).collect();
    let (env, s) = one_by_one(records);
    let out = s
        .key_by(|r: &(u64, i64)| &r.0)
        .count_window(5)
        .reduce(|a: &(u64, i64), b: &(u64, i64)| (a.0, a.1 + b.1))
        .collect();
    env.execute().bounded().await.unwrap();
    // Key 0 has 12 records (0, 2, .., 22), key 1 has 11: two full windows each; the rest never
    // fires (a count window fires only when full).
    let sum = |from: i64| (0..5).map(|j| from + 2 * j).sum::<i64>();
    let want = vec![(0, sum(0)), (0, sum(10)), (1, sum(1)), (1, sum(11))];
    assert_eq!(sorted(out.records()), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_window_settings_fail_the_job_at_build_time_naming_the_problem() {
    type Case = (
        &'static str,
        Box<dyn Fn(weir_runtime::KeyedStream<u64, (u64, i64)>)>,
    );
    let cases: Vec<Case> = vec![
        (
            "size must be at least 1 ms",
            Box::new(|k| {
                k.window(TumblingEventTimeWindows::of(Duration::ZERO))
                    .timestamps(|r: &(u64, i64)| r.1)
                    .reduce(|a, _| *a);
            }),
        ),
        (
            "must not be larger than its size",
            Box::new(|k| {
                k.window(SlidingEventTimeWindows::of(
                    Duration::from_millis(10),
                    Duration::from_millis(20),
                ))
                .timestamps(|r: &(u64, i64)| r.1)
                .reduce(|a, _| *a);
            }),
        ),
        (
            "gap must be at least 1 ms",
            Box::new(|k| {
                k.window(EventTimeSessionWindows::with_gap(Duration::ZERO))
                    .timestamps(|r: &(u64, i64)| r.1)
                    .reduce(|a, _| *a);
            }),
        ),
        (
            "needs each record's timestamp",
            Box::new(|k| {
                k.window(TumblingEventTimeWindows::of(Duration::from_millis(5)))
                    .reduce(|a, _| *a);
            }),
        ),
        (
            "count trigger must count at least 1",
            Box::new(|k| {
                k.count_window(0).reduce(|a, _| *a);
            }),
        ),
    ];
    for (want, build) in cases {
        let env = StreamEnvironment::new();
        let s = env
            .from_collection(vec![(1u64, 1i64)])
            .key_by(|r: &(u64, i64)| &r.0);
        build(s);
        match env.execute().bounded().await {
            Err(JobError::Invalid(msg)) => assert!(msg.contains(want), "{want}: {msg}"),
            other => panic!("{want}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processing_time_windows_fire_on_the_wall_clock_and_count_each_record_once() {
    // 60 records 3 ms apart in wall-clock time, in tumbling windows of 40 ms of processing time.
    let env = StreamEnvironment::new();
    env.set_parallelism(1);
    env.config_mut().batch_size = 1;
    let out = env
        .from_collection((0..60u64).map(|i| (i % 2, 1i64)).collect())
        .map(|r: (u64, i64)| {
            std::thread::sleep(Duration::from_millis(3));
            r
        })
        .key_by(|r: &(u64, i64)| &r.0)
        .window(weir_runtime::window::TumblingProcessingTimeWindows::of(
            Duration::from_millis(40),
        ))
        .reduce_with(
            |a: &(u64, i64), b: &(u64, i64)| (a.0, a.1 + b.1),
            |key: &u64, w: &TimeWindow, r: (u64, i64)| (*key, w.start, w.end, r.1),
        )
        .collect();
    env.execute().bounded().await.unwrap();
    let fired = out.records();
    // The windows still open when the input ended did not fire; every other record was counted
    // once, in an aligned window of 40 ms.
    assert!(fired.len() >= 2, "{fired:?}");
    for (_, start, end, _) in &fired {
        assert_eq!(start.rem_euclid(40), 0, "{fired:?}");
        assert_eq!(end - start, 40, "{fired:?}");
    }
    let windows: std::collections::BTreeSet<(u64, i64)> =
        fired.iter().map(|(k, s, _, _)| (*k, *s)).collect();
    assert_eq!(
        windows.len(),
        fired.len(),
        "each window fires once: {fired:?}"
    );
    for key in 0..2u64 {
        let counted: i64 = fired.iter().filter(|f| f.0 == key).map(|f| f.3).sum();
        assert!(
            (1..=30).contains(&counted),
            "key {key}: {counted} of 30 ({fired:?})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Stop with a savepoint: suspended or drained windows.
// ---------------------------------------------------------------------------------------------

const STOP_RECORDS: u64 = 60_000;
const STOP_WINDOW_MS: i64 = 1_000;

/// Counts per key and tumbling window of record indices as milliseconds, records `0..n` in
/// order per subtask, written exactly once as `(key,start,count)` lines into part files under
/// `dir` (each transaction one file, a repeated commit a no-op: a restore commits the
/// savepoint's pending transactions again).
fn counting_job(failures: &Arc<Failures>, dir: &std::path::Path) -> StreamEnvironment {
    let env = StreamEnvironment::new();
    env.set_parallelism(2).set_max_parallelism(128);
    env.config_mut().batch_size = 64;
    let records: Vec<(u64, i64)> = (0..STOP_RECORDS).map(|i| (i % 3, i as i64)).collect();
    let s = env
        .from_collection(records)
        .uid("records")
        .assign_timestamps_and_watermarks(Duration::from_millis(10), |r: &(u64, i64)| r.1)
        .uid("watermarks");
    inject(s, failures)
        .key_by(|r: &(u64, i64)| &r.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(
            STOP_WINDOW_MS as u64,
        )))
        .timestamps(|r: &(u64, i64)| r.1)
        .aggregate_with(Count, |k: &u64, w: &TimeWindow, n: i64| (*k, w.start, n))
        .uid("counts")
        .write_to_files(dir)
        .uid("files");
    env
}

/// The `(key,start,count)` lines of every part file under `dir`.
fn written(dir: &std::path::Path) -> Vec<(u64, i64, i64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.starts_with("part-") {
            continue;
        }
        for line in std::fs::read_to_string(e.path()).unwrap().lines() {
            let f: Vec<i64> = line
                .trim_matches(|c| c == '(' || c == ')')
                .split(',')
                .map(|x| x.parse().unwrap())
                .collect();
            out.push((f[0] as u64, f[1], f[2]));
        }
    }
    out.sort();
    out
}
struct Count;

impl AggregateFunction<(u64, i64), i64, i64> for Count {
    fn create_accumulator(&self) -> i64 {
        0
    }
    fn add(&self, _: (u64, i64), acc: &mut i64) {
        *acc += 1;
    }
    fn get_result(&self, acc: &i64) -> i64 {
        *acc
    }
    fn merge(&self, a: i64, b: i64) -> i64 {
        a + b
    }
}

fn expected_counts() -> Vec<(u64, i64, i64)> {
    let mut c: BTreeMap<(u64, i64), i64> = BTreeMap::new();
    for i in 0..STOP_RECORDS {
        let ts = i as i64;
        *c.entry((i % 3, ts - ts.rem_euclid(STOP_WINDOW_MS)))
            .or_default() += 1;
    }
    c.into_iter().map(|((k, s), n)| (k, s, n)).collect()
}

/// Runs the counting job until a third of the records went through, then stops it with a
/// savepoint (`drain` or not); returns the savepoint and the job's result.
async fn stop_part_way(
    drain: bool,
    savepoints: &std::path::Path,
    out: &std::path::Path,
) -> (String, weir_runtime::JobResult) {
    let paced = Failures::paced(Vec::new(), 200);
    let env = counting_job(&paced, out);
    env.set_savepoint_dir(savepoints);
    let client = weir_runtime::JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    while paced.seen() < STOP_RECORDS / 3 {
        assert!(!run.is_finished(), "the run ended before it was stopped");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let savepoint = client.stop_with_savepoint(None, drain).await.unwrap();
    let result = run.await.unwrap().unwrap();
    (savepoint, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_drain_windows_are_suspended_in_the_savepoint_and_complete_after_the_resume() {
    let (savepoints, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (savepoint, first) = stop_part_way(false, savepoints.path(), dir.path()).await;
    assert!(first.source_records < STOP_RECORDS, "stopped part way");
    let before = written(dir.path());
    // Nothing fired early: every window written before the stop is complete.
    let want = expected_counts();
    assert!(!before.is_empty());
    for w in &before {
        assert!(want.contains(w), "a window fired before its end: {w:?}");
    }
    assert!(before.len() < want.len());
    let env = counting_job(&Failures::at(Vec::new()), dir.path());
    env.restore_from(&savepoint);
    let second = env.execute().bounded().await.unwrap();
    assert_eq!(
        second.source_records_since_restore,
        STOP_RECORDS - first.source_records
    );
    // Each window once, with every record: those counted before the stop came back from the
    // savepoint.
    assert_eq!(written(dir.path()), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_drain_every_window_fires_before_the_savepoint() {
    let (savepoints, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, first) = stop_part_way(true, savepoints.path(), dir.path()).await;
    let emitted = first.source_records;
    assert!(emitted < STOP_RECORDS, "stopped part way");
    let fired = written(dir.path());
    // Event time advanced to the end: every record emitted was counted in a window that fired,
    // once, the last windows with what they held at the stop.
    let counted: i64 = fired.iter().map(|w| w.2).sum();
    assert_eq!(counted as u64, emitted);
    let windows: std::collections::BTreeSet<(u64, i64)> =
        fired.iter().map(|(k, s, _)| (*k, *s)).collect();
    assert_eq!(windows.len(), fired.len(), "a window fired twice");
    let want = expected_counts();
    assert!(
        fired.iter().any(|w| !want.contains(w)),
        "the drain fired the open windows with what they held"
    );
}

/// The counting job at parallelism 1 over `records`, with an hour of allowed lateness.
fn late_counting_job(
    records: Vec<(u64, i64)>,
    failures: &Arc<Failures>,
    dir: &std::path::Path,
) -> StreamEnvironment {
    let env = StreamEnvironment::new();
    env.set_parallelism(1).set_max_parallelism(128);
    env.config_mut().batch_size = 64;
    let s = env
        .from_collection(records)
        .uid("records")
        .assign_timestamps_and_watermarks(Duration::from_millis(10), |r: &(u64, i64)| r.1)
        .uid("watermarks");
    inject(s, failures)
        .key_by(|r: &(u64, i64)| &r.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(
            STOP_WINDOW_MS as u64,
        )))
        .timestamps(|r: &(u64, i64)| r.1)
        .allowed_lateness(Duration::from_secs(3_600))
        .aggregate_with(Count, |k: &u64, w: &TimeWindow, n: i64| (*k, w.start, n))
        .uid("counts")
        .write_to_files(dir)
        .uid("files");
    env
}

/// A window that fired before a savepoint and gets a record within the allowed lateness right
/// after the resume (when the restored operator's watermark starts over, so the record is not
/// late yet) fires again when the watermark passes its end, with the record counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_fired_before_a_savepoint_fires_again_for_a_record_within_lateness() {
    let (savepoints, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut records: Vec<(u64, i64)> = (0..STOP_RECORDS).map(|i| (i % 3, i as i64)).collect();
    let paced = Failures::paced(Vec::new(), 200);
    let env = late_counting_job(records.clone(), &paced, dir.path());
    env.set_savepoint_dir(savepoints.path());
    let client = weir_runtime::JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    while paced.seen() < STOP_RECORDS / 3 {
        assert!(!run.is_finished(), "the run ended before it was stopped");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let savepoint = client.stop_with_savepoint(None, false).await.unwrap();
    let first = run.await.unwrap().unwrap();
    let resume_at = first.source_records as usize;
    assert!(resume_at > 2 * STOP_WINDOW_MS as usize && resume_at < records.len());
    // Key 0's first window fired before the stop, with every record 0, 3, …, 999.
    let first_window = (0u64, 0i64, (STOP_WINDOW_MS + 2) / 3);
    assert!(written(dir.path()).contains(&first_window));
    // The first record read after the resume belongs to that window.
    records[resume_at] = (0, 500);
    let env = late_counting_job(records.clone(), &Failures::at(Vec::new()), dir.path());
    env.restore_from(&savepoint);
    env.execute().bounded().await.unwrap();
    let out = written(dir.path());
    let again = (0u64, 0i64, first_window.2 + 1);
    assert!(
        out.contains(&again),
        "the window did not fire again: {:?}",
        &out[..3]
    );
    // Every window's last firing counts exactly the records of both runs that fall in it.
    let mut want: BTreeMap<(u64, i64), i64> = BTreeMap::new();
    for &(k, ts) in &records {
        *want
            .entry((k, ts - ts.rem_euclid(STOP_WINDOW_MS)))
            .or_default() += 1;
    }
    let mut last: BTreeMap<(u64, i64), i64> = BTreeMap::new();
    for (k, start, n) in out {
        let e = last.entry((k, start)).or_default();
        *e = (*e).max(n);
    }
    assert_eq!(last, want);
}

// ---------------------------------------------------------------------------------------------
// Per-split watermarks in the source.
// ---------------------------------------------------------------------------------------------

const SPLIT_RECORDS: u64 = 40_000;

/// Counts per key (`i % 5`) and 100 ms window of the generator's records, record `i` at `i` ms,
/// with watermarks per split in the source and no bound: results and late records.
/// The job, its failures, its results and its late records.
type SplitJob = (
    StreamEnvironment,
    Arc<Failures>,
    weir_runtime::CollectHandle<(u64, i64, i64)>,
    weir_runtime::CollectHandle<(u64, i64)>,
);

fn split_job(failures: &[u64]) -> SplitJob {
    let (env, injected) = env(2, failures);
    let make = |i: u64| (i % 5, i as i64);
    let records = env.from_generator_with_watermarks(
        Some(SPLIT_RECORDS),
        make,
        Duration::ZERO,
        |r: &(u64, i64)| r.1,
    );
    let (results, late) = inject(records.uid("generator"), &injected)
        .key_by(|r: &(u64, i64)| &r.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(100)))
        .timestamps(|r: &(u64, i64)| r.1)
        .side_output_late_data()
        .uid("split-windows")
        .aggregate_with(Count, |k: &u64, w: &TimeWindow, n: i64| (*k, w.start, n));
    (env, injected, results.collect(), late.collect())
}

fn expected_split_counts() -> Vec<(u64, i64, i64)> {
    let mut c: BTreeMap<(u64, i64), i64> = BTreeMap::new();
    for i in 0..SPLIT_RECORDS {
        *c.entry((i % 5, (i as i64) - (i as i64).rem_euclid(100)))
            .or_default() += 1;
    }
    c.into_iter().map(|((k, s), n)| (k, s, n)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_split_watermarks_make_no_record_of_an_in_order_split_late_under_failures() {
    let (env, injected, results, late) = split_job(&[SPLIT_RECORDS / 2]);
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(injected.injected(), 1);
    assert_eq!(r.restarts, 1);
    assert!(late.records().is_empty(), "{} late", late.records().len());
    assert_eq!(sorted(results.records()), expected_split_counts());
}
