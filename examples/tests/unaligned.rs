//! Unaligned and alternating checkpoints are exactly-once: under backpressure and failures, and
//! when a restore replays persisted in-flight data; configurations they cannot honour are
//! rejected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;
use support::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_examples::{WordCountOptions, build, expected_totals};
use weir_runtime::testing::{Gate, GateDriver};
use weir_runtime::{
    CheckpointStatus, CheckpointingMode, CollectHandle, JobClient, JobError, JobResult, JobStatus,
    RestartStrategy, StreamEnvironment,
};

/// The word count under real backpressure: one buffer per channel, small batches, a closed gate
/// before the sink (drive it with [`gate_driver`]), checkpoints every 10 ms, unaligned from the
/// start.
fn backpressured(dir: &Path, records: u64) -> WordCountOptions {
    WordCountOptions {
        records: Some(records),
        parallelism: 2,
        checkpoint_interval: Some(Duration::from_millis(10)),
        checkpoint_dir: dir.join("checkpoints"),
        buffers_per_channel: 1,
        batch_size: 64,
        sink_gate: Some(Gate::closed()),
        unaligned: true,
        aligned_checkpoint_timeout: Duration::ZERO,
        restart: Some(RestartStrategy::FixedDelay {
            attempts: 20,
            delay: Duration::ZERO,
        }),
        ..WordCountOptions::default()
    }
}

/// Records the gate lets through per round.
const PER_ROUND: u64 = 2_000;

/// The gate of a [`backpressured`] word count, which blocks its sum-and-sink subtasks.
fn gated(o: &WordCountOptions) -> Gated {
    Gated {
        gate: o.sink_gate.clone().expect("a backpressured job has a gate"),
        subtasks: o.parallelism as usize,
        per_round: PER_ROUND,
    }
}

/// Drives the gate of a [`backpressured`] word count.
fn gate_driver(client: &JobClient, o: &WordCountOptions) -> GateDriver {
    let g = gated(o);
    GateDriver::start(client.clone(), g.gate, g.subtasks, g.per_round)
}

/// A one-line summary of a run's checkpoints, for failure messages.
fn checkpoints_summary(r: &JobResult) -> String {
    format!(
        "status={:?} restarts={} checkpoints completed={} failed={}",
        r.status, r.restarts, r.checkpoints_completed, r.checkpoints_failed
    )
}

/// Of the checkpoints whose barriers the gate held, those that completed must have persisted
/// in-flight data (the records queued at the gate that the barrier overtook), and there must
/// be one.
fn assert_held_checkpoints_persisted_in_flight(
    held: &[u64],
    in_flight: &BTreeMap<u64, u64>,
    ctx: &str,
) {
    let completed: Vec<(u64, u64)> = held
        .iter()
        .filter_map(|id| in_flight.get(id).map(|b| (*id, *b)))
        .collect();
    assert!(
        !completed.is_empty(),
        "{ctx}: none of the checkpoints held at the gate ({held:?}) completed"
    );
    assert!(
        completed.iter().any(|(_, b)| *b > 0),
        "{ctx}: no checkpoint held at the gate persisted in-flight data: {completed:?}"
    );
}

/// How many of the completed checkpoints seen persisted in-flight data, for messages.
fn in_flight_summary(in_flight: &BTreeMap<u64, u64>) -> String {
    let with = in_flight.values().filter(|b| **b > 0).count();
    let max = in_flight.values().max().copied().unwrap_or(0);
    format!(
        "{with} of {} completed checkpoints seen persisted in-flight data (max {max} B)",
        in_flight.len()
    )
}

// ---------------------------------------------------------------------------------------------
// Exactly-once under backpressure and failures.
// ---------------------------------------------------------------------------------------------

/// Runs the backpressured word count with `aligned_checkpoint_timeout` (0: unaligned from the
/// start; else the alternating handler) and five injected failures in three groups, two of them
/// a pair a few hundred to a few thousand records apart so that the second failure lands during
/// or just after the restore of the first. The totals must be exact, and some completed
/// checkpoint must have persisted in-flight data.
async fn exact_under_backpressure_and_failures(aligned_checkpoint_timeout: Duration) {
    let seed = test_seed();
    let mut rng = SplitMix(seed);
    let records = 200_000u64;
    let third = records / 3;
    let mut fail_after = Vec::new();
    for k in 0..2 {
        let p = k * third + rng.range(third / 4, third * 3 / 4);
        fail_after.push(p);
        fail_after.push(p + rng.range(300, 3_000));
    }
    fail_after.push(2 * third + rng.range(third / 4, third * 3 / 4));
    let dir = tempfile::tempdir().unwrap();
    let o = WordCountOptions {
        seed: rng.next(),
        fail_after: fail_after.clone(),
        aligned_checkpoint_timeout,
        ..backpressured(dir.path(), records)
    };
    let ctx = format!(
        "seed={seed} records={records} fail_after={fail_after:?} \
         aligned_checkpoint_timeout={aligned_checkpoint_timeout:?} generator seed={}",
        o.seed
    );
    let (env, totals, injector) = build(&o);
    let started = Instant::now();
    let gated = gated(&o);
    let (r, in_flight, held) = execute_gated(env, gated)
        .await
        .unwrap_or_else(|e| panic!("{ctx}: the job failed: {e}"));
    let ctx = format!(
        "{ctx}: {}, {}, {} held at the gate, in {:?}",
        checkpoints_summary(&r),
        in_flight_summary(&in_flight),
        held.len(),
        started.elapsed()
    );
    eprintln!("{ctx}");
    assert_eq!(r.status, JobStatus::Finished, "{ctx}");
    assert_eq!(injector.injected(), fail_after.len(), "{ctx}");
    // A failure can land in a task of an attempt already being torn down (the injector counts
    // over all attempts); the job master ignores such stale failures. The three groups are far
    // apart, so each restarts the job at least once.
    assert!((3..=fail_after.len() as u32).contains(&r.restarts), "{ctx}");
    let got = totals.get();
    assert_eq!(got, expected_totals(records, o.seed), "{ctx}");
    assert_eq!(got.values().sum::<i64>(), records as i64, "{ctx}");
    assert!(r.checkpoints_completed > 0, "{ctx}");
    assert_held_checkpoints_persisted_in_flight(&held, &in_flight, &ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_under_backpressure_and_failures_is_exact() {
    exact_under_backpressure_and_failures(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternating_under_backpressure_and_failures_is_exact() {
    exact_under_backpressure_and_failures(Duration::from_millis(1)).await;
}

// ---------------------------------------------------------------------------------------------
// Restore from a checkpoint that holds in-flight data.
// ---------------------------------------------------------------------------------------------

/// The directory `<root>/<job>/chk-<id>` of a complete checkpoint.
fn checkpoint_dir(root: &Path, id: u64) -> PathBuf {
    let name = format!("chk-{id}");
    std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|job| job.path().join(&name))
        .find(|chk| chk.join("_metadata").is_file())
        .unwrap_or_else(|| panic!("no complete {name} under {}", root.display()))
}

/// Runs the backpressured unaligned word count over `records` records, keeping 100 checkpoints,
/// until a checkpoint with in-flight data completes; cancels it then. Returns that checkpoint's
/// directory and its in-flight bytes.
async fn cancel_after_an_in_flight_checkpoint(o: &WordCountOptions) -> (PathBuf, u64) {
    let (env, _totals, _) = build(o);
    let client = JobClient::default();
    let c = client.clone();
    let job = tokio::spawn(env.execute_with(client).bounded());
    let driver = gate_driver(&c, o);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (id, bytes) = loop {
        let found = c
            .checkpoint_stats()
            .into_iter()
            .find(|s| s.status == CheckpointStatus::Completed && s.in_flight_size > 0);
        if let Some(s) = found {
            break (s.id.0, s.in_flight_size);
        }
        assert!(
            !job.is_finished(),
            "the job ended before a checkpoint with in-flight data completed: {:?}",
            job.await.unwrap().map(|r| checkpoints_summary(&r))
        );
        assert!(
            Instant::now() < deadline,
            "no checkpoint with in-flight data in 20 s: {:?}",
            c.checkpoint_stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    c.cancel();
    driver.stop().await;
    let r = job.await.unwrap().unwrap();
    assert_eq!(r.status, JobStatus::Canceled, "{}", checkpoints_summary(&r));
    (checkpoint_dir(&o.checkpoint_dir, id), bytes)
}

/// A checkpoint with in-flight data, restored into a new job (unaligned, and aligned): the job
/// replays the persisted channel state before new input and ends with the totals of the whole
/// input. The running sums continue from the checkpointed state and the sink publishes the
/// latest one per word, so what the cancelled run published does not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_from_an_unaligned_checkpoint_replays_in_flight_data_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let records = 150_000u64;
    let first = WordCountOptions {
        retain: 100,
        ..backpressured(tmp.path(), records)
    };
    let (chk, bytes) = cancel_after_an_in_flight_checkpoint(&first).await;
    for unaligned in [true, false] {
        let ctx = format!(
            "from {} ({bytes} in-flight bytes), unaligned={unaligned}",
            chk.display()
        );
        let restored = WordCountOptions {
            from: Some(chk.clone()),
            checkpoint_dir: tmp.path().join(format!("restored-{unaligned}")),
            retain: 1,
            unaligned,
            restart: None,
            ..first.clone()
        };
        let (env, totals, _) = build(&restored);
        let r = env
            .execute()
            .bounded()
            .await
            .unwrap_or_else(|e| panic!("{ctx}: the restored job failed: {e}"));
        let ctx = format!("{ctx}: {}", checkpoints_summary(&r));
        assert_eq!(r.status, JobStatus::Finished, "{ctx}");
        assert_eq!(r.restarts, 0, "{ctx}");
        let from = r.restored_from.clone().unwrap_or_default();
        let name = chk.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            from.trim_end_matches('/').ends_with(&format!("/{name}")),
            "{ctx}: restored from {from:?}"
        );
        assert!(
            r.source_records < records,
            "{ctx}: the sources started over"
        );
        let got = totals.get();
        assert_eq!(got, expected_totals(records, first.seed), "{ctx}");
        assert_eq!(got.values().sum::<i64>(), records as i64, "{ctx}");
    }
}

/// In-flight data is per channel: restoring it at another parallelism is an error that names the
/// change, not a panic or a silent loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_in_flight_data_at_another_parallelism_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let first = WordCountOptions {
        retain: 100,
        max_parallelism: Some(128),
        ..backpressured(tmp.path(), 150_000)
    };
    let (chk, _) = cancel_after_an_in_flight_checkpoint(&first).await;
    for parallelism in [1, 3] {
        let restored = WordCountOptions {
            from: Some(chk.clone()),
            parallelism,
            checkpoint_dir: tmp.path().join(format!("restored-{parallelism}")),
            restart: None,
            ..first.clone()
        };
        let (env, _, _) = build(&restored);
        match env.execute().bounded().await {
            Err(JobError::Restore { reason, .. }) => {
                assert!(reason.contains("in-flight"), "{reason}");
                assert!(
                    reason.contains(&format!("parallelism from 2 to {parallelism}")),
                    "{reason}"
                );
            }
            Err(e) => panic!("parallelism {parallelism}: expected a restore error, got {e:?}"),
            Ok(r) => panic!(
                "parallelism {parallelism}: restored in-flight data at another parallelism: {}",
                checkpoints_summary(&r)
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Flink's VerifyingSink check through the exactly-once collect sink.
// ---------------------------------------------------------------------------------------------

/// The keyed-sum job, its committed output, its failures and its gate (closed).
type KeyedSumJob = (
    StreamEnvironment,
    CollectHandle<(u64, i64)>,
    Arc<Failures>,
    Arc<Gate>,
);

/// generator → inject → (key, 1) → key_by → sum → gate → collect, at parallelism 3 with one
/// buffer per channel and unaligned checkpoints every 10 ms. The gate starts closed.
fn unaligned_keyed_sum_job(dir: &Path, records: u64, thresholds: Vec<u64>) -> KeyedSumJob {
    let env = StreamEnvironment::new();
    env.set_job_name("unaligned-verifying-sink")
        .set_parallelism(3)
        .enable_checkpointing(Duration::from_millis(10))
        .set_checkpoint_dir(dir)
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 20,
            delay: Duration::ZERO,
        });
    {
        let mut config = env.config_mut();
        config.checkpoint.unaligned = true;
        config.buffers_per_channel = 1;
        config.batch_size = 64;
    }
    let failures = Failures::at(thresholds);
    let gate = Gate::closed();
    let sums = inject(
        env.from_generator(Some(records), |i| i).uid("source"),
        &failures,
    )
    .map(|i: u64| (key_of(i), 1i64))
    .uid("pairs")
    .key_by(|t: &(u64, i64)| &t.0)
    .sum()
    .uid("sum");
    let handle = sums.through_gate(&gate).uid("gate").collect();
    (env, handle, failures, gate)
}

/// Under unaligned checkpoints, backpressure and failures (two of them close together), the
/// committed output is, per key, exactly the running sums `1..=count`: nothing lost, duplicated
/// or reordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_collect_sink_has_no_loss_duplicate_or_reordering_under_failures() {
    let seed = test_seed();
    let mut rng = SplitMix(seed);
    let records = 100_000u64;
    let p = rng.range(records / 8, records / 3);
    let thresholds = vec![
        p,
        p + rng.range(300, 3_000),
        rng.range(records / 2, records * 7 / 8),
    ];
    let dir = tempfile::tempdir().unwrap();
    let ctx = format!("seed={seed} records={records} thresholds={thresholds:?}");
    let (env, handle, failures, gate) = unaligned_keyed_sum_job(dir.path(), records, thresholds);
    let started = Instant::now();
    let gated = Gated {
        gate,
        subtasks: 3,
        per_round: 2_000,
    };
    let (r, in_flight, held) = execute_gated(env, gated)
        .await
        .unwrap_or_else(|e| panic!("{ctx}: the job failed: {e}"));
    let ctx = format!(
        "{ctx}: {}, {}, {} held at the gate, in {:?}",
        checkpoints_summary(&r),
        in_flight_summary(&in_flight),
        held.len(),
        started.elapsed()
    );
    eprintln!("{ctx}");
    assert_eq!(r.status, JobStatus::Finished, "{ctx}");
    assert_eq!(failures.injected(), 3, "{ctx}");
    assert_eq!(r.restarts, 3, "{ctx}");
    let last = verify_running_sums(&handle.records_by_subtask(), &ctx);
    assert_eq!(last, counts_per_key(records), "{ctx}: final running sums");
    assert_eq!(handle.records().len() as u64, records, "{ctx}");
    assert_held_checkpoints_persisted_in_flight(&held, &in_flight, &ctx);
}

// ---------------------------------------------------------------------------------------------
// Configurations unaligned checkpoints reject.
// ---------------------------------------------------------------------------------------------

/// A small checkpointed job whose checkpoint configuration `configure` changes; returns the error
/// `execute` must end with.
async fn invalid_job(configure: impl FnOnce(&StreamEnvironment)) -> String {
    let env = StreamEnvironment::new();
    let tmp = tempfile::tempdir().unwrap();
    env.set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(10))
        .set_checkpoint_dir(tmp.path().join("checkpoints"));
    let _ = env
        .from_generator(Some(1_000), |i| i)
        .uid("source")
        .collect();
    configure(&env);
    match env.execute().bounded().await {
        Err(e @ JobError::Invalid(_)) => e.to_string(),
        Err(e) => panic!("expected JobError::Invalid, got {e:?}"),
        Ok(r) => panic!("the job ran: {}", checkpoints_summary(&r)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_with_at_least_once_is_rejected() {
    let message = invalid_job(|env| {
        let mut c = env.checkpoint_config();
        c.unaligned = true;
        c.mode = CheckpointingMode::AtLeastOnce;
    })
    .await;
    assert!(message.contains("unaligned"), "{message}");
    assert!(message.contains("at-least-once"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_with_concurrent_checkpoints_is_rejected() {
    let message = invalid_job(|env| {
        let mut c = env.checkpoint_config();
        c.unaligned = true;
        c.max_concurrent = 2;
    })
    .await;
    assert!(message.contains("unaligned"), "{message}");
    assert!(
        message.contains("max concurrent checkpoints = 2"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aligned_checkpoint_timeout_without_unaligned_is_rejected() {
    let message = invalid_job(|env| {
        env.checkpoint_config().aligned_checkpoint_timeout = Duration::from_millis(5);
    })
    .await;
    assert!(message.contains("aligned checkpoint timeout"), "{message}");
    assert!(message.contains("unaligned"), "{message}");
}

// ---------------------------------------------------------------------------------------------
// What the job result reports.
// ---------------------------------------------------------------------------------------------

/// `JobResult::checkpoint_in_flight` holds the persisted in-flight bytes of every completed
/// checkpoint, in completion order: its tail agrees with the statistics of the last checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_result_reports_the_in_flight_bytes_of_completed_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let o = backpressured(dir.path(), 60_000);
    let (env, totals, _) = build(&o);
    let gated = gated(&o);
    let (r, seen, _) = execute_gated(env, gated).await.unwrap();
    assert_eq!(totals.get(), expected_totals(60_000, o.seed));
    let ctx = format!("{}, {}", checkpoints_summary(&r), in_flight_summary(&seen));
    assert!(seen.values().any(|b| *b > 0), "{ctx}");
    assert_eq!(
        r.checkpoint_in_flight.len() as u64,
        r.checkpoints_completed,
        "{ctx}"
    );
    // One checkpoint at a time: completion order is id order.
    let last: Vec<u64> = seen.values().copied().collect();
    let tail = &last[last.len().saturating_sub(r.checkpoint_history.len())..];
    assert!(
        r.checkpoint_in_flight.ends_with(tail),
        "{ctx}: JobResult::checkpoint_in_flight {:?} disagrees with the checkpoint statistics \
         {tail:?}",
        r.checkpoint_in_flight
    );
}

/// Stop-with-savepoint while unaligned checkpoints run under real backpressure: the savepoint is
/// aligned (it holds no in-flight data, so it can be restored at another parallelism), and the
/// job resumed from it at parallelism 3 counts every record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_with_savepoint_under_backpressure_restores_at_another_parallelism() {
    let tmp = tempfile::tempdir().unwrap();
    let records = 400_000;
    let o = WordCountOptions {
        savepoint_dir: Some(tmp.path().join("savepoints")),
        ..backpressured(tmp.path(), records)
    };
    let (env, _, _) = build(&o);
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    let driver = gate_driver(&client, &o);
    // Unaligned checkpoints first, one of them with data in flight.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client
        .checkpoint_stats()
        .iter()
        .any(|s| s.status == CheckpointStatus::Completed && s.in_flight_size > 0)
    {
        assert!(
            Instant::now() < deadline,
            "no checkpoint with in-flight data: {:?}",
            client.checkpoint_stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let savepoint = loop {
        match client.stop_with_savepoint(None, false).await {
            Ok(p) => break p,
            Err(e) => {
                assert!(Instant::now() < deadline, "no savepoint: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let stopped = tokio::time::timeout(Duration::from_secs(120), job)
        .await
        .expect("the stop did not end the job")
        .unwrap()
        .unwrap();
    driver.stop().await;
    assert!(stopped.source_records < records, "the job stopped early");
    let path = PathBuf::from(savepoint.trim_start_matches("file://"));
    let meta = weir_runtime::checkpoint::CheckpointMetadata::from_bytes(
        "_metadata",
        &std::fs::read(path.join("_metadata")).unwrap(),
    )
    .unwrap();
    assert!(
        meta.in_flight.is_empty(),
        "a savepoint holds no in-flight data"
    );

    let resumed = WordCountOptions {
        parallelism: 3,
        from: Some(path),
        checkpoint_dir: tmp.path().join("checkpoints-2"),
        ..backpressured(tmp.path(), records)
    };
    let (env, totals, _) = build(&resumed);
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    let driver = gate_driver(&client, &resumed);
    let r = job.await.unwrap().unwrap();
    let held = driver.stop().await;
    assert!(
        !held.is_empty(),
        "no checkpoint of the resumed run was held at the gate"
    );
    assert_eq!(totals.get(), expected_totals(records, o.seed));
    assert_restored(&r, records, "resumed at parallelism 3 from the savepoint");
}
