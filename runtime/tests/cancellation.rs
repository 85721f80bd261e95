//! Cancelling a job whatever its operators cost per record: `map` checks the cancellation signal
//! between records, and a task stuck inside one record is abandoned after the task cancellation
//! timeout (the watchdog), so the job still ends CANCELED.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bounded.rs"]
mod bounded;
use bounded::Bounded;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_runtime::operator::{Chained, OneInputOperator, OpResult, Output};
use weir_runtime::{JobClient, JobResult, JobStatus, StreamEnvironment};

/// How long a cancel may take on a loaded two-core machine; the runtime aims at well under a
/// second.
const CANCEL_BOUND: Duration = Duration::from_secs(5);

/// Waits until `ready` holds, failing after a minute.
async fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not within a minute");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Cancels the running job and returns its result and how long the cancel took.
async fn cancel(
    client: &JobClient,
    job: tokio::task::JoinHandle<Result<JobResult, weir_runtime::JobError>>,
) -> (JobResult, Duration) {
    let asked = Instant::now();
    client.cancel();
    let result = tokio::time::timeout(Duration::from_secs(60), job)
        .await
        .expect("the cancelled job did not end within a minute")
        .unwrap()
        .unwrap();
    (result, asked.elapsed())
}

/// A map that never returns from one record (it ignores the cancellation signal) until the test
/// releases it: the job ends CANCELED after the cancellation timeout while the operator is
/// still stuck, and the test then lets the thread go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_stuck_in_an_operator_is_abandoned_and_the_job_ends_cancelled() {
    let env = StreamEnvironment::new();
    env.set_job_name("stuck").set_parallelism(2);
    env.config_mut().task_cancellation_timeout = Duration::from_millis(200);
    let stuck = Arc::new(AtomicBool::new(false));
    let release = Arc::new(AtomicBool::new(false));
    let returned = Arc::new(AtomicBool::new(false));
    let (s, r, back) = (stuck.clone(), release.clone(), returned.clone());
    env.from_generator(None, |i| i)
        .map(move |i: u64| {
            if i == 1000 {
                s.store(true, Ordering::SeqCst);
                while !r.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                back.store(true, Ordering::SeqCst);
            }
            (i % 5, 1i64)
        })
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    wait_until("a task stuck in its map", || stuck.load(Ordering::SeqCst)).await;
    let (result, took) = cancel(&client, job).await;
    let still_stuck = !returned.load(Ordering::SeqCst);
    release.store(true, Ordering::SeqCst);
    eprintln!("cancelled with a stuck task in {took:?}");
    assert_eq!(result.status, JobStatus::Canceled);
    assert!(
        still_stuck,
        "the operator returned before the job ended: nothing was abandoned"
    );
    assert!(took < CANCEL_BOUND, "the cancel took {took:?}");
    wait_until("the released operator returns", || {
        returned.load(Ordering::SeqCst)
    })
    .await;
}

/// A map that takes 20 ms per record (20 s per batch of 1024) stops between records: with a
/// cancellation timeout far longer than the bound, the job ends quickly only because the map
/// checks the signal before each record, and it calls the function at most a few times more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_map_stops_between_records() {
    let env = StreamEnvironment::new();
    env.set_job_name("slow-map").set_parallelism(2);
    env.config_mut().task_cancellation_timeout = Duration::from_secs(60);
    let calls = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicU64::new(0));
    let (c, d) = (calls.clone(), closed.clone());
    env.from_generator(None, |i| i)
        .map(move |i: u64| {
            c.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            (i % 5, 1i64)
        })
        .transform::<(u64, i64)>("Drop Probe", move |_, next| {
            Box::new(Chained::new(DropProbe(d.clone()), next))
        })
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    // Both subtasks are inside a batch.
    wait_until("the slow map running", || calls.load(Ordering::SeqCst) >= 4).await;
    let at_cancel = calls.load(Ordering::SeqCst);
    let (result, took) = cancel(&client, job).await;
    let at_end = calls.load(Ordering::SeqCst);
    eprintln!("cancelled a 20 ms-per-record map in {took:?}, {at_end} calls ({at_cancel} before)");
    assert_eq!(result.status, JobStatus::Canceled);
    assert!(took < CANCEL_BOUND, "the cancel took {took:?}");
    // Each of the two subtasks finishes the record it is in, and may have started one more
    // between the count and the cancel.
    assert!(
        at_end - at_cancel <= 4,
        "{} calls after the cancel",
        at_end - at_cancel
    );
    // The tasks stopped (they were not abandoned): both subtasks' maps are gone, so no call can
    // come after the job ended.
    assert_eq!(
        closed.load(Ordering::SeqCst),
        2,
        "a subtask outlived the job"
    );
    assert_eq!(calls.load(Ordering::SeqCst), at_end);
}

/// Passes records on; counts its drops, one per subtask that ended (its chain is dropped
/// with it, the map before it included).
struct DropProbe(Arc<AtomicU64>);

impl OneInputOperator<(u64, i64)> for DropProbe {
    type Out = (u64, i64);

    fn process(&mut self, t: (u64, i64), out: &mut dyn Output<(u64, i64)>) -> OpResult {
        out.push(t)
    }
}

impl Drop for DropProbe {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
