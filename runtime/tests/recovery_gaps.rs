//! Recovery paths no other test took: running out of restart attempts with the exponential-delay
//! strategy; a failure before the first checkpoint of a job restored from a savepoint (it must
//! restore the savepoint again, not start over); and a start whose listing of earlier
//! checkpoints keeps failing (the job fails naming the fault rather than guess checkpoint ids).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::assert_resumed;
use weir_checkpoint::OpendalCheckpointStorage;
use weir_checkpoint::storage::faults::{FaultInjectingStorage, OpKind};
use weir_runtime::{
    JobClient, JobError, JobStatus, LatestHandle, RestartStrategy, StorageConfig, StreamEnvironment,
};

const KEYS: u64 = 11;
/// No test here may take longer than this.
const BOUND: Duration = Duration::from_secs(120);

fn expected(records: u64) -> BTreeMap<u64, i64> {
    let mut m = BTreeMap::new();
    for i in 0..records {
        *m.entry(i % KEYS).or_insert(0) += 1;
    }
    m
}

/// generator → map (`each` sees every record) → key by → sum → latest per key.
fn word_count(
    env: &StreamEnvironment,
    records: u64,
    each: impl Fn(u64) + Send + Sync + 'static,
) -> LatestHandle<u64, i64> {
    env.from_generator(Some(records), |i| i)
        .uid("source")
        .map(move |i: u64| {
            each(i);
            (i % KEYS, 1i64)
        })
        .uid("pairs")
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .latest_per_key()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exponential_delay_gives_up_after_its_attempts_naming_the_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(10))
        .set_checkpoint_dir(tmp.path())
        .set_restart_strategy(RestartStrategy::ExponentialDelay {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(80),
            reset_after: Duration::from_secs(3600),
            attempts: 3,
        });
    // Every attempt fails at the same record.
    let _ = word_count(&env, 100_000, |i| {
        if i == 5_000 {
            panic!("a record that always fails");
        }
    });
    let started = Instant::now();
    let result = tokio::time::timeout(BOUND, env.execute())
        .await
        .expect("bounded");
    match result {
        Err(JobError::Failed {
            restarts,
            strategy,
            cause,
        }) => {
            assert_eq!(restarts, 3, "{strategy}: {cause}");
            assert!(
                strategy.to_lowercase().contains("exponential"),
                "{strategy}"
            );
            assert!(cause.contains("a record that always fails"), "{cause}");
        }
        other => panic!("expected the strategy to give up, got {other:?}"),
    }
    // It waited 20 + 40 + 80 ms between the attempts.
    assert!(
        started.elapsed() >= Duration::from_millis(140),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_before_the_first_checkpoint_of_a_restored_job_restores_the_savepoint_again() {
    let tmp = tempfile::tempdir().unwrap();
    let records = 400_000u64;
    // The first run stops with a savepoint part way.
    let first = StreamEnvironment::new();
    first
        .set_parallelism(2)
        .set_checkpoint_dir(tmp.path().join("chk1"))
        .set_savepoint_dir(tmp.path().join("sp"));
    let seen = AtomicU64::new(0);
    let _ = word_count(&first, records, move |_| {
        if seen.fetch_add(1, Ordering::Relaxed).is_multiple_of(1024) {
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let client = JobClient::default();
    let job = tokio::spawn(first.execute_with(client.clone()).bounded());
    // Part way: the sources have emitted some records.
    while client.source_records() < 10_000 {
        assert!(
            !job.is_finished(),
            "the first run ended before it was stopped"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let savepoint = loop {
        match client.stop_with_savepoint(None, false).await {
            Ok(p) => break p,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let stopped = tokio::time::timeout(BOUND, job)
        .await
        .expect("bounded")
        .unwrap()
        .unwrap();
    assert_eq!(stopped.status, JobStatus::Finished);
    assert!(
        stopped.source_records < records,
        "the first run stopped early"
    );

    // The restored run fails once before any checkpoint of its own can complete (its interval
    // is an hour): the failover must restore the savepoint again.
    let second = StreamEnvironment::new();
    second
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_secs(3600))
        .set_checkpoint_dir(tmp.path().join("chk2"))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 1,
            delay: Duration::ZERO,
        })
        .restore_from(savepoint.trim_start_matches("file://"));
    let failed = Arc::new(AtomicBool::new(false));
    let count = AtomicU64::new(0);
    let f = failed.clone();
    let totals = word_count(&second, records, move |_| {
        if count.fetch_add(1, Ordering::Relaxed) == 1_000 && !f.swap(true, Ordering::SeqCst) {
            panic!("a failure before the first checkpoint");
        }
    });
    let r = tokio::time::timeout(BOUND, second.execute())
        .await
        .expect("bounded")
        .unwrap();
    assert!(failed.load(Ordering::SeqCst));
    assert_eq!(r.restarts, 1);
    assert_eq!(
        r.checkpoints_completed, 1,
        "no checkpoint of its own completed but the final one (FLIP-147)"
    );
    assert_eq!(totals.get(), expected(records));
    // Exact, and the sources resumed after the failover: the savepoint's state was used twice.
    assert_resumed(
        &r,
        records,
        "a failure before the first checkpoint after a savepoint restore",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_checkpoint_listing_keeps_failing_fails_naming_the_fault() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = Arc::new(FaultInjectingStorage::new(
        Arc::new(OpendalCheckpointStorage::fs(tmp.path()).unwrap()),
        7,
    ));
    storage.set_fault_rate(OpKind::Read, 1.0).unwrap();
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(10))
        .set_checkpoint_storage(StorageConfig::Custom(storage.clone()));
    let _ = word_count(&env, 10_000, |_| {});
    let result = tokio::time::timeout(BOUND, env.execute())
        .await
        .expect("bounded");
    let err = result.expect_err("a start that cannot list earlier checkpoints must fail");
    assert!(err.to_string().contains("injected fault"), "{err}");
    assert!(err.to_string().contains("list_checkpoints"), "{err}");
    // The first try and three retries: the error is the fourth read fault.
    assert!(err.to_string().contains("read fault 4,"), "{err}");
    assert!(storage.stats().read_faults >= 4, "{err}");
    assert!(!has_checkpoint(tmp.path()), "nothing was written");
}

fn has_checkpoint(root: &Path) -> bool {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .any(|job| {
            std::fs::read_dir(job.path())
                .into_iter()
                .flatten()
                .flatten()
                .any(|c| c.file_name().to_string_lossy().starts_with("chk-"))
        })
}
