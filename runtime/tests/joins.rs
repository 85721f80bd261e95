//! Joins: a window join pairs the records of both sides with one key in one window, an interval
//! join those within the interval, each pair exactly once under failures; an empty interval is
//! refused at build time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use std::time::Duration;
use support::{Failures, inject};
use weir_runtime::window::TumblingEventTimeWindows;
use weir_runtime::{DataStream, JobError, RestartStrategy, StreamEnvironment};

/// `(key, event time)`.
type Rec = (u64, i64);

const FIRST: u64 = 3_000;
const SECOND: u64 = 2_000;

fn first(i: u64) -> Rec {
    (i % 10, 2 * i as i64)
}

fn second(j: u64) -> Rec {
    (j % 7, 3 * j as i64 + 1)
}

fn env_with_failures(failures: &[u64]) -> (StreamEnvironment, std::sync::Arc<Failures>) {
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .set_max_parallelism(128)
        .enable_checkpointing(Duration::from_millis(10))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::ZERO,
        });
    env.set_checkpoint_dir(tempfile::tempdir().unwrap().keep());
    env.config_mut().batch_size = 32;
    (env, Failures::paced(failures.to_vec(), 300))
}

/// Both sides, each in order per subtask (one split per reader), with watermarks.
fn sides(
    env: &StreamEnvironment,
    failures: &std::sync::Arc<Failures>,
) -> (DataStream<Rec>, DataStream<Rec>) {
    let a = env
        .from_collection((0..FIRST).map(first).collect())
        .uid("first")
        .assign_timestamps_and_watermarks(Duration::ZERO, |r: &Rec| r.1)
        .uid("first-watermarks");
    let b = env
        .from_collection((0..SECOND).map(second).collect())
        .uid("second")
        .assign_timestamps_and_watermarks(Duration::ZERO, |r: &Rec| r.1)
        .uid("second-watermarks");
    (inject(a, failures), b)
}

/// Every `(key, first time, second time)` of a pair that `matches`, computed without the engine.
fn pairs(matches: impl Fn(&Rec, &Rec) -> bool) -> Vec<(u64, i64, i64)> {
    let mut out = Vec::new();
    for i in 0..FIRST {
        let a = first(i);
        for j in 0..SECOND {
            let b = second(j);
            if a.0 == b.0 && matches(&a, &b) {
                out.push((a.0, a.1, b.1));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_join_pairs_each_window_s_records_exactly_once_under_failures() {
    let (env, failures) = env_with_failures(&[FIRST / 2]);
    let (a, b) = sides(&env, &failures);
    let joined = a
        .join(b)
        .on(|r: &Rec| &r.0, |r: &Rec| &r.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(100)))
        .timestamps(|r: &Rec| r.1, |r: &Rec| r.1)
        .uid("window-join")
        .apply(|a: &Rec, b: &Rec| (a.0, a.1, b.1))
        .collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.restarts, 1);
    let mut got = joined.records();
    got.sort();
    let want = pairs(|a, b| a.1.div_euclid(100) == b.1.div_euclid(100));
    assert!(want.len() > 1_000, "{}", want.len());
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_join_pairs_records_within_the_interval_exactly_once_under_failures() {
    let (env, failures) = env_with_failures(&[FIRST / 3]);
    let (a, b) = sides(&env, &failures);
    let joined = a
        .join(b)
        .on(|r: &Rec| &r.0, |r: &Rec| &r.0)
        .between(-10, 20)
        .timestamps(|r: &Rec| r.1, |r: &Rec| r.1)
        .process(|a: &Rec, b: &Rec| (a.0, a.1, b.1))
        .uid("interval-join")
        .collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.restarts, 1);
    let mut got = joined.records();
    got.sort();
    let want = pairs(|a, b| a.1 - 10 <= b.1 && b.1 <= a.1 + 20);
    assert!(want.len() > 100, "{}", want.len());
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_interval_is_refused_at_build_time() {
    let env = StreamEnvironment::new();
    let a = env.from_collection(vec![(1u64, 1i64)]);
    let b = env.from_collection(vec![(1u64, 1i64)]);
    let _ = a
        .join(b)
        .on(|r: &Rec| &r.0, |r: &Rec| &r.0)
        .between(5, -5)
        .timestamps(|r: &Rec| r.1, |r: &Rec| r.1)
        .process(|a: &Rec, _: &Rec| *a)
        .collect();
    match env.execute().bounded().await {
        Err(JobError::Invalid(msg)) => assert!(msg.contains("the interval is empty"), "{msg}"),
        other => panic!("{other:?}"),
    }
}
