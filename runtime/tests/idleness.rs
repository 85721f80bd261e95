//! Idleness: a source subtask with nothing to read stops holding back event time downstream
//! once it is idle (`WithIdleness`), so windows fire while it waits; without idleness they
//! wait for it. Both runs end with every window fired once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_runtime::idleness::WithIdleness;
use weir_runtime::operator::SubtaskInfo;
use weir_runtime::source::{SourceFunction, SourceStatus};
use weir_runtime::state::{AggregateFunction, OperatorStateBackend};
use weir_runtime::window::{TimeWindow, TumblingEventTimeWindows};
use weir_runtime::{JobClient, StreamEnvironment, TaskError};

/// Records of subtask 0: `(i % 3, i)` for i below this, event time i ms.
const TICKS: i64 = 2_000;

/// Subtask 0 emits its ticks, subtask 1 the first five of them (0..5 ms); then each waits, emitting
/// nothing, until released, and ends. The watermark is each's largest time minus 1.
struct Ticks {
    subtask: u32,
    next: i64,
    release: Arc<AtomicBool>,
    emitted: Arc<AtomicU64>,
}

impl SourceFunction<(u64, i64)> for Ticks {
    fn open(&mut self, _: &SubtaskInfo, _: &mut OperatorStateBackend) -> Result<(), TaskError> {
        Ok(())
    }

    fn next_batch(
        &mut self,
        out: &mut Vec<(u64, i64)>,
        max: usize,
    ) -> Result<SourceStatus, TaskError> {
        let end = if self.subtask == 0 { TICKS } else { 5 };
        while self.next < end && out.len() < max {
            let i = self.next;
            out.push(((i % 3) as u64, i));
            self.next += 1;
        }
        self.emitted.fetch_add(out.len() as u64, Ordering::SeqCst);
        Ok(if !out.is_empty() {
            SourceStatus::More
        } else if self.release.load(Ordering::SeqCst) {
            SourceStatus::End
        } else {
            SourceStatus::Idle
        })
    }

    fn snapshot_state(&mut self, _: &mut OperatorStateBackend) -> Result<(), TaskError> {
        Ok(())
    }

    fn current_watermark(&self) -> Option<i64> {
        (self.next > 0).then(|| self.next - 2)
    }
}

struct Count;

impl AggregateFunction<(u64, i64), u64, u64> for Count {
    fn create_accumulator(&self) -> u64 {
        0
    }
    fn add(&self, _: (u64, i64), acc: &mut u64) {
        *acc += 1;
    }
    fn get_result(&self, acc: &u64) -> u64 {
        *acc
    }
    fn merge(&self, a: u64, b: u64) -> u64 {
        a + b
    }
}

/// Counts per key and 100 ms window; `fired_early` counts the windows fired before release.
async fn run(idleness: Option<Duration>) -> (u64, Vec<(u64, i64, u64)>) {
    let env = StreamEnvironment::new();
    env.set_parallelism(2);
    let (release, emitted) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let fired_early = Arc::new(AtomicU64::new(0));
    let (r, e) = (release.clone(), emitted.clone());
    let results = env
        .add_source("Ticks", move |info: &SubtaskInfo| {
            let ticks = Box::new(Ticks {
                subtask: info.index,
                next: 0,
                release: r.clone(),
                emitted: e.clone(),
            }) as Box<dyn SourceFunction<(u64, i64)>>;
            match idleness {
                Some(timeout) => Box::new(WithIdleness::new(ticks, timeout)),
                None => ticks,
            }
        })
        .key_by(|r: &(u64, i64)| &r.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(100)))
        .timestamps(|r: &(u64, i64)| r.1)
        .aggregate_with(Count, |k: &u64, w: &TimeWindow, n: u64| (*k, w.start, n))
        .map({
            let (release, fired_early) = (release.clone(), fired_early.clone());
            move |r| {
                if !release.load(Ordering::SeqCst) {
                    fired_early.fetch_add(1, Ordering::SeqCst);
                }
                r
            }
        })
        .collect();
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client).bounded());
    while emitted.load(Ordering::SeqCst) < TICKS as u64 + 5 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Every window but the last ends before subtask 0's watermark (1,998): 19 windows of 3 keys.
    let early = 19 * 3;
    let deadline = Instant::now() + Duration::from_secs(20);
    let settle = if idleness.is_some() {
        while fired_early.load(Ordering::SeqCst) < early && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Duration::from_millis(50)
    } else {
        Duration::from_millis(300)
    };
    tokio::time::sleep(settle).await;
    let before_release = fired_early.load(Ordering::SeqCst);
    release.store(true, Ordering::SeqCst);
    job.await.unwrap().unwrap();
    let mut got = results.records();
    got.sort();
    (before_release, got)
}

fn expected() -> Vec<(u64, i64, u64)> {
    let mut c = std::collections::BTreeMap::new();
    for i in 0..TICKS {
        *c.entry(((i % 3) as u64, i - i % 100)).or_insert(0u64) += 1;
    }
    for i in 0..5 {
        *c.entry(((i % 3) as u64, i - i % 100)).or_insert(0) += 1;
    }
    c.into_iter().map(|((k, s), n)| (k, s, n)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_source_subtask_stops_holding_back_the_windows() {
    let (early, got) = run(Some(Duration::from_millis(20))).await;
    assert_eq!(
        early,
        19 * 3,
        "the windows before subtask 0's watermark fired"
    );
    assert_eq!(got, expected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_idleness_a_waiting_source_subtask_holds_every_window() {
    let (early, got) = run(None).await;
    assert_eq!(early, 0, "subtask 1's watermark (3) holds every window");
    assert_eq!(got, expected());
}
